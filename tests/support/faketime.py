"""Processes with a wrong clock: libfaketime (Debian's ``faketime``) preloaded with an
offset."""

from __future__ import annotations

import glob

FAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), "")


def skewed(offset: str | None) -> dict[str, str]:
    """Environment for a process whose wall clock is ``offset`` off ("+600s", "-600s");
    its monotonic clock is left alone (timers still run at the real pace)."""
    if offset is None:
        return {}
    return {
        "LD_PRELOAD": FAKETIME,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }
