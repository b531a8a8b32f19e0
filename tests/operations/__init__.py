"""Each operation of the Python API through an Outbox on a real Valkey: accept and its bounds,
idempotency, park, the operator actions, the reads, history and versions. ``make
test-cluster`` runs this folder again on a Valkey Cluster."""
