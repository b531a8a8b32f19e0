"""Deliverers, verifiers and ledger probes."""
