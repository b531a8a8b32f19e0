"""A channel layer whose receive fails a few times first, as channels-redis does on a pooled
connection that went stale when Valkey restarted (tests/django/ws/test_refusals.py)."""

from channels.layers import InMemoryChannelLayer


class FlakyReceiveLayer(InMemoryChannelLayer):
    """``InMemoryChannelLayer`` whose first ``failures`` receives raise ConnectionError."""

    def __init__(self, failures: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.failures = failures

    async def receive(self, channel):
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("Connection closed by server.")
        return await super().receive(channel)
