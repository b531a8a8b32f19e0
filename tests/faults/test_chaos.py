"""The short run of the fault suite (``make chaos`` runs the long one)."""

import pytest

from tests.support import chaos

pytestmark = pytest.mark.slow


def test_short_chaos_run_keeps_every_invariant(capsys):
    rows = chaos.run(short=True)
    out = capsys.readouterr().out
    assert "| scenario |" in out
    assert len(rows) == len(chaos.SCENARIOS)
    for row in rows:
        assert row.ok, row.line()
        if not row.skipped:  # a row skipped where a tool is missing says so in its line
            assert row.faults > 0, f"{row.scenario}: no fault was injected"
