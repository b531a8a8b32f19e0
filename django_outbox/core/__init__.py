"""The outbox core: no Django imports (a test enforces it)."""
