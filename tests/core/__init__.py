"""Building blocks on their own: entries, each Lua script against a real Valkey, the client's
command packing, the shipped test helpers. ``make test-cluster`` runs this folder again on a
Valkey Cluster."""
