"""Valkey Cluster: one slot per script, sharded indices, the cluster harness (``-m cluster``;
``make test-cluster`` runs these)."""
