"""One user's accepts over every workspace: the REST accept's cross-workspace throttle.

The per-user bounds of the core (``USER_MAX_QUEUED``, ``USER_ACCEPTS_PER_MINUTE``) are exact
but per workspace: a workspace is one cluster slot, and no script counts across slots. So a
user the access policy lets into many workspaces could accept that many times the bound
(docs/explanation/idempotency.md#per-user-bounds). :class:`UserAcceptThrottle` bounds the
user's REST accepts over all workspaces together to ``USER_ACCEPTS_PER_MINUTE_ALL`` in any
60 s — approximately: it is DRF's :class:`~rest_framework.throttling.SimpleRateThrottle`,
counted in Django's default cache (exact across processes with a shared cache such as
Redis/Valkey or Memcached; per process with the default ``LocMemCache``, check ``W014`` with
``DummyCache``, which counts nothing), and every authorised accept request counts, a
duplicate or a refused one included. A throttled accept answers 429 ``throttled`` with
``Retry-After`` and stores nothing. The Python API is not throttled: it trusts its caller.
"""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import SimpleRateThrottle

from ..conf import outbox_settings
from ..core.keys import user_digest


class UserAcceptThrottle(SimpleRateThrottle):
    """At most ``OUTBOX["USER_ACCEPTS_PER_MINUTE_ALL"]`` accepts per user in any 60 s,
    over every workspace (0/None: no throttle). Keyed by a digest of the user's primary key;
    an anonymous request is never counted (the access policy refuses it first)."""

    scope = "outbox_accept"

    def get_rate(self) -> str | None:
        """``"<n>/min"`` from the setting, or None when it is off."""
        limit = outbox_settings().user_accepts_per_minute_all
        return f"{limit}/min" if limit else None

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        # A digest, not the key itself: any primary key gives a short, safe cache key.
        return self.cache_format % {"scope": self.scope, "ident": user_digest(str(user.pk))}
