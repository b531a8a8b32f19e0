"""The short run of the fault suite (``make chaos`` runs the long one)."""

import pytest

from tests.support import chaos

pytestmark = pytest.mark.slow

#: Rows with a test of their own below (mutants name it: tools/mutate/mutants.toml).
ALONE = ("steering",)


def test_short_chaos_run_keeps_every_invariant(capsys):
    rows = chaos.run(short=True, only=[name for name, _ in chaos.SCENARIOS if name not in ALONE])
    out = capsys.readouterr().out
    assert "| scenario |" in out
    assert len(rows) == len(chaos.SCENARIOS) - len(ALONE)
    for row in rows:
        assert row.ok, row.line()
        if not row.skipped:  # a row skipped where a tool is missing says so in its line
            assert row.faults > 0, f"{row.scenario}: no fault was injected"


def test_short_steering_row_keeps_every_invariant():
    """Stop, cancels, edits, moves and send-nows under worker SIGKILLs and a Valkey restart
    (docs/howto/cutting.md): nothing lost, sent twice, misordered, or cut unverified."""
    (row,) = chaos.run(short=True, only=["steering"])
    assert row.ok, row.line()
    assert row.faults > 1, f"{row.scenario}: no worker was SIGKILLed"
