"""Delivering: the step (claim, deliver or verify, settle), its outcomes, leases and timing,
crash recovery, the worker loop and worker processes, the worker metrics. ``make
test-cluster`` runs this folder again on a Valkey Cluster."""
