"""Faults: lost replies, clients gone mid-request, Valkey killed or full, skewed clocks, a
failover, and the fault suite's short run."""
