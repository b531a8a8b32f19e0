"""The agent's reference to a delivery (docs/howto/deliverer.md#what-it-returns): what a
deliverer returns, or a verifier with ``Verdict.DELIVERED``, is kept on the delivered entry
as ``agentRef`` by the settle, and reaches ``entry_delivered`` as ``agent_ref``, the entry's
wire dict and the WebSocket's; a deliverer that returns nothing, or something else, delivers
as before."""

from __future__ import annotations

import json
import logging

import pytest

from django_outbox import Entry, Verdict
from django_outbox.core.rules import MAX_AGENT_REF_BYTES, agent_ref_json
from django_outbox.core.scripts import settle_next_argv
from django_outbox.core.step import RECEIPT_TTL_MS
from django_outbox.errors import AmbiguousError
from tests.support.helpers import aaccept
from tests.support.script_calls import NOW, call, seed

WS, SES = "w1", "s1"
REF = {"threadID": "3f0c-thread", "runID": "1ef9-run"}


def returning(value):
    async def deliver(entry, *, workspace_id, session_id, attempt):
        return value

    return deliver


def delivered(signals_log) -> list[tuple[Entry, object]]:
    return [(entry, kw["agent_ref"]) for entry, kw in signals_log.calls["delivered"]]


async def test_what_the_deliverer_returns_is_kept_on_the_delivered_entry(make_outbox, signals_log):
    outbox = make_outbox(deliverer=returning(REF))
    accepted = await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    [(entry, agent_ref)] = delivered(signals_log)
    assert entry.id == accepted.id and entry.delivered_at is not None
    assert agent_ref == REF == entry.agent_ref
    assert entry.to_dict()["agentRef"] == REF
    assert Entry.from_json(entry.to_json()).agent_ref == REF
    await outbox.aclose()


async def test_the_sync_deliverers_return_is_kept_too(make_outbox, signals_log):
    def deliver(entry, *, workspace_id, session_id, attempt):
        return {"messageID": f"msg_{entry.id}"}

    outbox = make_outbox(deliverer=deliver)
    accepted = await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert delivered(signals_log)[0][1] == {"messageID": f"msg_{accepted.id}"}
    await outbox.aclose()


@pytest.mark.parametrize(
    "returned",
    [None, True, "run-1", ["threadID"], {}],
    ids=["none", "true", "a-string", "a-list", "empty"],
)
async def test_a_deliverer_that_returns_no_reference_delivers_as_before(
    make_outbox, signals_log, returned
):
    outbox = make_outbox(deliverer=returning(returned))
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    [(entry, agent_ref)] = delivered(signals_log)
    assert agent_ref is None and entry.agent_ref is None
    assert "agentRef" not in entry.to_dict() and "agentRef" not in entry.to_json()
    await outbox.aclose()


@pytest.mark.parametrize(
    "returned",
    [
        {"runID": 7},
        {"run id": "x"},
        {"runID": "line\nbreak"},
        {f"k{i}": "v" for i in range(9)},
        {"runID": "x" * 257},
        {f"k{i}": "\u00e9" * 40 for i in range(8)},
    ],
    ids=["not-a-string", "bad-name", "control-char", "nine-members", "long-value", "too-big"],
)
async def test_a_malformed_reference_is_dropped_and_the_delivery_stands(
    make_outbox, signals_log, caplog, returned
):
    assert agent_ref_json(returned)[0] == ""
    outbox = make_outbox(deliverer=returning(returned))
    await aaccept(outbox)
    with caplog.at_level(logging.WARNING, logger="django_outbox"):
        assert await outbox.adeliver_once(WS, SES)
    [(entry, agent_ref)] = delivered(signals_log)
    assert entry.delivered_at is not None and agent_ref is None
    assert "not kept" in caplog.text
    await outbox.aclose()


def test_the_largest_reference_fits_its_bound():
    biggest = {f"k{i}": "x" * (MAX_AGENT_REF_BYTES // 8 - 12) for i in range(8)}
    encoded, why = agent_ref_json(biggest)
    assert why == "" and len(encoded) <= MAX_AGENT_REF_BYTES
    assert json.loads(encoded) == biggest


async def test_the_verifier_that_finds_the_delivery_gives_its_reference(make_outbox, signals_log):
    async def ambiguous(entry, *, workspace_id, session_id, attempt):
        raise AmbiguousError("the answer was lost")

    async def verify(entry, *, workspace_id, session_id):
        return Verdict.DELIVERED, REF

    outbox = make_outbox(deliverer=ambiguous, verifier=verify, verify_delay=0)
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)  # ambiguous
    assert delivered(signals_log) == []
    assert await outbox.adeliver_once(WS, SES)  # verified
    [(entry, agent_ref)] = delivered(signals_log)
    assert agent_ref == REF == entry.agent_ref
    await outbox.aclose()


async def test_a_merged_delivery_gives_every_prompt_the_same_reference(make_outbox, signals_log):
    outbox = make_outbox(deliverer=returning(REF))
    outbox.deliverer.outbox_capabilities = {"merge"}
    ids = [(await aaccept(outbox, key, if_busy="merge")).id for key in ("k1", "k2", "k3")]
    while await outbox.alist(WS, SES):
        assert await outbox.adeliver_once(WS, SES)
    assert await outbox.adeliver_once(WS, SES) in (True, False)  # the members' owed signals
    got = {entry.id: agent_ref for entry, agent_ref in delivered(signals_log)}
    assert got == dict.fromkeys(ids, REF)
    await outbox.aclose()


def test_a_delivery_settled_with_the_next_claim_keeps_its_reference(outbox):
    """settle_next.lua (nobody listens to entry_delivered: the settle goes with the next
    claim) keeps the reference on the delivered entry it answers, as settle_delivered.lua."""
    first, second = seed(outbox, accepted=NOW - 2), seed(outbox, accepted=NOW - 1)
    assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
    ref = agent_ref_json(REF)[0]
    argv = settle_next_argv("tok", first.id, outbox.config, RECEIPT_TTL_MS, 30_000, [first.id], ref)
    kind, settled, claimed = call(outbox, "settle_next", *argv)
    assert kind == "next" and settled[0] == "removed"
    assert Entry.from_json(settled[1]).agent_ref == REF
    assert Entry.from_json(claimed[1]).id == second.id
    assert Entry.from_json(claimed[1]).agent_ref is None
