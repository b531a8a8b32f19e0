"""The request key (``Entry.request_key``, the agent's ``Idempotency-Key``) follows the
request (docs/howto/agents.md#the-idempotency-key): the same for every resend of one
request, new after an edit that changes the content and after an operator's retry of a
prompt whose attempts failed for good; kept where the outcome is still unknown."""

from __future__ import annotations

from django_outbox import Status
from django_outbox.errors import AmbiguousError
from tests.support.scenarios import amake  # noqa: F401  (the fixture)

WS, SES = "w1", "s1"


async def refuse(entry, **kwargs):
    raise RuntimeError("HTTP 400")


async def cut(entry, **kwargs):
    raise AmbiguousError("the reply was lost")


async def only(outbox):
    [entry] = await outbox.alist(WS, SES)
    return entry


async def accept(outbox, text="t"):
    return await outbox.aaccept(WS, SES, user_id="u", client_message_id="k", text=text)


async def test_a_new_entry_is_keyed_by_its_id(amake):  # noqa: F811
    outbox = amake(deliverer=refuse)
    entry = await accept(outbox)
    assert (entry.revision, entry.request_key) == (0, entry.id)
    assert "revision" not in entry.to_dict()


async def test_an_edit_that_changes_the_content_makes_a_new_request(amake):  # noqa: F811
    outbox = amake(deliverer=refuse)
    entry = await accept(outbox, "one")
    await outbox.aedit(WS, SES, entry.id, text="two")
    assert (await only(outbox)).request_key == f"{entry.id}.1"
    await outbox.aedit(WS, SES, entry.id, text="two")  # the same content: the same request
    edited = await only(outbox)
    assert edited.request_key == f"{entry.id}.1" and edited.to_dict()["revision"] == 1


async def test_a_retry_after_a_definitive_failure_makes_a_new_request(amake):  # noqa: F811
    outbox = amake(deliverer=refuse, max_attempts=1)
    entry = await accept(outbox)
    assert await outbox.aretry(WS, SES, entry.id) is not None  # never attempted: same key
    assert (await only(outbox)).request_key == entry.id
    assert await outbox.adeliver_once(WS, SES)
    failed = await only(outbox)
    assert (failed.status, failed.reason) == (Status.ERROR, "max_attempts")
    await outbox.aretry(WS, SES, entry.id)
    retried = await only(outbox)
    assert retried.status is Status.PENDING and retried.request_key == f"{entry.id}.1"


async def test_a_retry_of_an_unknown_outcome_keeps_the_key_its_verification_asks_with(amake):  # noqa: F811
    outbox = amake(deliverer=cut)  # no verifier: error / unverifiable
    entry = await accept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    unknown = await only(outbox)
    assert (unknown.status, unknown.reason) == (Status.ERROR, "unverifiable")
    await outbox.aretry(WS, SES, entry.id)
    assert (await only(outbox)).request_key == entry.id
