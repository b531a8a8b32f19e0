"""What each viewer reads of a failed delivery (docs/explanation/security.md).

An agent that answers HTTP 500 with a body echoing its request headers and environment:
members read a classification (``errorKind``), the status (``errorStatus``)
and a short text holding nothing the agent wrote, over REST and the WebSocket; staff
(the admin's view permission) read the stored excerpt there and in the admin, and the
worker's log has it too, every secret of it removed. Each kind is pinned to the text a
real delivery stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from types import SimpleNamespace

import httpx
import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.admin.utils import quote as admin_quote
from django.contrib.auth.models import Permission
from django.test import override_settings
from django.urls import reverse
from rest_framework.test import APIClient

from django_outbox import get_outbox
from django_outbox.core.entry import Verdict
from django_outbox.core.rules import ErrorKind, ErrorSummary, entry_for_viewer, summarize_error
from django_outbox.delivery import opencode
from django_outbox.delivery.opencode import OpencodeClient
from django_outbox.errors import AmbiguousError, HoldDeliveryError, PriorAttemptPendingError
from django_outbox.policy import reads_error_excerpts
from django_outbox.ws.routing import websocket_urlpatterns
from example_project.fake_server import Reply
from tests.support.fake_opencode import FakeOpencode, Fault
from tests.support.helpers import aaccept, accept, redis_channel_layers
from tests.support.valkey import free_port

WS, SES = "w1", "ses_leaky1"  # opencode session IDs start with "ses"
ALLOW_MEMBERS = "tests.django.test_error_summary.members_may_view"
OPENCODE_DELIVER = "django_outbox.delivery.opencode.deliver"

# What the agent echoes in its error body, and what of it must reach nobody.
SK_ANT = "sk-ant-api03-Zq8Xw7Vu6Ts5Rq4Po3Nm2Lk1"
SK_PROJ = "sk-proj-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYLEAKYKEY"
SESSION_COOKIE = "q7w8e9r0t1y2u3i4o5p6a7s8"
SECRETS = [SK_ANT, SK_PROJ, AWS_SECRET, SESSION_COOKIE]
#: The agent's own words: the excerpt staff read, and members must not.
AGENT_WORDS = "provider call failed"
LEAKY_BODY = json.dumps(
    {
        "name": "UnknownError",
        "data": {
            "message": AGENT_WORDS,
            "request": {"headers": {"x-api-key": SK_ANT, "cookie": f"sessionid={SESSION_COOKIE}"}},
            "env": f"OPENAI_API_KEY={SK_PROJ} AWS_SECRET_ACCESS_KEY={AWS_SECRET}",
        },
    }
).encode()
MEMBER_TEXT = "the agent answered with an error (HTTP 500)"


def members_may_view(user, workspace_id, session_id, action):
    """Every signed-in user is a member of every workspace here: who reads what of an
    error is what is tested, not the access policy."""
    return True


class LeakyAgent(FakeOpencode):
    """An agent that answers every prompt HTTP 500 with :data:`LEAKY_BODY`."""

    async def handle(self, name: str, request, *args: str) -> Reply:
        if name == "post_message":
            return Reply(500, LEAKY_BODY, [("content-type", "application/json")])
        return await super().handle(name, request, *args)


def assert_nothing_of_the_agent(text: str, port: int) -> None:
    """No secret, none of the agent's words and not its URL."""
    for value in [*SECRETS, AGENT_WORDS, "UnknownError", f"127.0.0.1:{port}"]:
        assert value not in text, f"{value!r} in {text!r}"


def assert_no_secret(text: str) -> None:
    for value in SECRETS:
        assert value not in text, f"{value!r} in {text!r}"


@pytest.fixture
def agent_port() -> int:
    return free_port()


@pytest.fixture
def leaky_settings(agent_port):
    """The outbox delivering to a :class:`LeakyAgent` on ``agent_port``."""
    settings = {
        "DELIVERER": OPENCODE_DELIVER,
        "OPENCODE": {"BASE_URL": f"http://127.0.0.1:{agent_port}"},
        "ACCESS_POLICY": ALLOW_MEMBERS,
    }
    with override_settings(OUTBOX=settings):
        yield settings


async def deliver_to_the_leaky_agent(port: int) -> None:
    """One delivery step of the session, the agent answering 500 with its secrets."""
    outbox = get_outbox()
    async with LeakyAgent(port=port):
        try:
            assert await outbox.adeliver_once(WS, SES)
        finally:
            await outbox.aclose()
            await opencode.aclose()


# --- every kind, from the text a real delivery stores -----------------------------------


async def stored_error(outbox, deliverer, *, steps: int = 1) -> str:
    """Accept one prompt, run ``steps`` delivery steps with ``deliverer``; the stored
    ``lastError``."""
    await aaccept(outbox, "k1", ws=WS, ses=SES)
    try:
        for _ in range(steps):
            assert await outbox.adeliver_once(WS, SES, deliverer=deliverer)
        (entry,) = await outbox.alist(WS, SES)
    finally:
        await outbox.aclose()
        await deliverer_close(deliverer)
    assert entry.last_error
    return entry.last_error


async def deliverer_close(deliverer) -> None:
    client = getattr(deliverer, "__self__", None)
    if isinstance(client, OpencodeClient):
        await client.aclose()


def opencode_client(port: int) -> OpencodeClient:
    return OpencodeClient(f"http://127.0.0.1:{port}", connect_timeout=1, timeout=5)


async def test_an_agent_error_is_agent_error_with_its_status(make_outbox, agent_port):
    async with LeakyAgent(port=agent_port):
        error = await stored_error(make_outbox(), opencode_client(agent_port).deliver)
    assert summarize_error(error) == ErrorSummary(ErrorKind.AGENT_ERROR, 500, MEMBER_TEXT)


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_refusal_is_rejected_with_its_status(make_outbox, status):
    async with FakeOpencode() as agent:
        agent.faults["post_message"] = Fault(status=status)
        error = await stored_error(make_outbox(), opencode_client(agent.port).deliver)
    assert error.startswith("OpencodeHTTPError: opencode answered HTTP")
    text = f"the agent refused the message (HTTP {status})"
    assert summarize_error(error) == ErrorSummary(ErrorKind.REJECTED, status, text)


async def test_an_agent_that_cannot_be_reached_is_unreachable(make_outbox):
    error = await stored_error(make_outbox(), opencode_client(free_port()).deliver)
    assert summarize_error(error) == ErrorSummary(
        ErrorKind.UNREACHABLE,
        None,
        "the agent could not be reached",
    )


async def test_a_connection_cut_before_the_answer_is_no_answer(make_outbox):
    async with FakeOpencode() as agent:
        agent.faults["post_message"] = Fault(cut="before_store")
        error = await stored_error(make_outbox(), opencode_client(agent.port).deliver)
    assert summarize_error(error).kind is ErrorKind.NO_ANSWER


async def test_a_status_raised_by_a_custom_deliverer_is_read(make_outbox, agent_port):
    async def deliver(entry, **kwargs):
        async with httpx.AsyncClient() as client:
            response = await client.post(f"http://127.0.0.1:{agent_port}/session/{SES}/message")
            response.raise_for_status()

    async with LeakyAgent(port=agent_port):
        error = await stored_error(make_outbox(), deliver)
    assert error.startswith("HTTPStatusError: Server error '500")
    assert summarize_error(error) == ErrorSummary(ErrorKind.AGENT_ERROR, 500, MEMBER_TEXT)


async def test_a_delivery_over_its_timeout_is_timeout(make_outbox):
    async def deliver(entry, **kwargs):
        await asyncio.sleep(30)

    error = await stored_error(make_outbox(delivery_timeout=0.2), deliver)
    assert summarize_error(error).kind is ErrorKind.TIMEOUT


def raising(exc: Exception):
    async def deliver(entry, **kwargs):
        raise exc

    return deliver


@pytest.mark.parametrize(
    "exc, kind",
    [
        (RuntimeError(f"agent said: {AGENT_WORDS}"), ErrorKind.FAILED),
        (PriorAttemptPendingError("still running"), ErrorKind.AGENT_BUSY),
        (HoldDeliveryError("HTTP 429", retry_after=60), ErrorKind.HELD),
        (AmbiguousError("lost"), ErrorKind.NO_ANSWER),  # (no verifier: error unverifiable)
    ],
)
async def test_what_a_deliverer_raises_gives_its_kind(make_outbox, exc, kind):
    error = await stored_error(make_outbox(), raising(exc))
    summary = summarize_error(error)
    assert (summary.kind, summary.status) == (kind, None)
    assert AGENT_WORDS not in summary.text


@pytest.mark.parametrize(
    "verdict, kind",
    [(Verdict.ABSENT, ErrorKind.NOT_RECEIVED), (Verdict.INCONCLUSIVE, ErrorKind.UNCONFIRMED)],
)
async def test_a_verification_gives_its_kind(make_outbox, verdict, kind):
    async def verify(entry, **kwargs):
        return verdict

    outbox = make_outbox(verifier=verify, verify_delay=0, verify_backoff=0)
    error = await stored_error(outbox, raising(AmbiguousError("lost")), steps=2)
    assert error.startswith("verifier")
    assert summarize_error(error).kind is kind


async def test_a_cancelled_delivery_is_interrupted(make_outbox):
    started = asyncio.Event()

    async def deliver(entry, **kwargs):
        started.set()
        await asyncio.sleep(30)

    outbox = make_outbox()
    await aaccept(outbox, "k1", ws=WS, ses=SES)
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES, deliverer=deliver))
    await started.wait()
    step.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await step
    (entry,) = await outbox.alist(WS, SES)
    await outbox.aclose()
    assert summarize_error(entry.last_error).kind is ErrorKind.INTERRUPTED


@pytest.mark.standalone
async def test_an_unreplicated_claim_is_unavailable(make_outbox):
    plain = make_outbox()
    await aaccept(plain, "k1", ws=WS, ses=SES)
    await plain.aclose()
    outbox = make_outbox(wait_replicas=1, wait_timeout=0.05)
    assert await outbox.adeliver_once(WS, SES, deliverer=raising(RuntimeError("unused")))
    (entry,) = await outbox.alist(WS, SES)
    await outbox.aclose()
    assert summarize_error(entry.last_error).kind is ErrorKind.UNAVAILABLE


def test_a_status_in_the_agents_own_words_is_not_its_answer():
    """Only a status the message starts with is the answer's: the agent's text may say
    anything."""
    summary = summarize_error("RuntimeError: upstream said opencode answered HTTP 503")
    assert (summary.kind, summary.status) == (ErrorKind.FAILED, None)


def test_entry_for_viewer_adds_the_kind_after_last_error_and_changes_nothing_else():
    data = {"id": "e1", "status": "pending", "lastError": "transient: x", "text": "hi"}
    member = entry_for_viewer(data, excerpt=False)
    assert list(member) == ["id", "status", "lastError", "errorKind", "text"]
    assert member["lastError"] == "the agent could not be reached"
    assert entry_for_viewer(data, excerpt=True)["lastError"] == "transient: x"
    assert data == {"id": "e1", "status": "pending", "lastError": "transient: x", "text": "hi"}
    plain = {"id": "e2", "status": "pending"}
    assert entry_for_viewer(plain, excerpt=False) is plain


# --- who reads the excerpt ------------------------------------------------------------


@pytest.mark.django_db
def test_only_who_may_view_entries_in_the_admin_reads_excerpts(django_user_model):
    make = django_user_model.objects.create_user
    view = Permission.objects.get(codename="view_outboxentry")
    viewer = make("viewer", password=None, is_staff=True)
    viewer.user_permissions.add(view)
    plain_staff = make("staff", password=None, is_staff=True)
    member = make("member", password=None)
    member.user_permissions.add(view)  # not staff: the admin would not let it in
    root = make("root", password=None, is_staff=True, is_superuser=True)
    gone = make("gone", password=None, is_staff=True, is_superuser=True, is_active=False)
    readers = {
        name: reads_error_excerpts(user)
        for name, user in [
            ("viewer", viewer),
            ("superuser", root),
            ("staff without view", plain_staff),
            ("member with view", member),
            ("inactive superuser", gone),
            ("anonymous", None),
        ]
    }
    assert readers == {
        "viewer": True,
        "superuser": True,
        "staff without view": False,
        "member with view": False,
        "inactive superuser": False,
        "anonymous": False,
    }


# --- a leaky agent through REST, the WebSocket, the admin and the worker's log ------------


@pytest.fixture
def clients(django_user_model):
    make = django_user_model.objects.create_user
    member, staff = APIClient(), APIClient()
    member.force_login(make("member", password=None))
    operator = make("operator", password=None, is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="django_outbox")
    )
    staff.force_login(operator)
    return SimpleNamespace(member=member, staff=staff)


@pytest.mark.django_db
def test_over_rest_members_read_the_kind_and_staff_the_excerpt(clients, leaky_settings, agent_port):
    url = f"/outbox/api/workspaces/{WS}/sessions/{SES}/messages/"
    accepted = clients.member.post(url, {"clientMessageID": "c1", "text": "hi"}, format="json")
    assert accepted.status_code == 202
    asyncio.run(deliver_to_the_leaky_agent(agent_port))

    member = clients.member.get(url)
    assert member.status_code == 200
    (entry,) = member.json()["entries"]
    assert entry["lastError"] == MEMBER_TEXT
    assert (entry["errorKind"], entry["errorStatus"]) == ("agent_error", 500)
    assert_nothing_of_the_agent(member.content.decode(), agent_port)

    staff = clients.staff.get(url)
    (entry,) = staff.json()["entries"]
    assert entry["lastError"].startswith(
        f"ambiguous: opencode answered HTTP 500 for http://127.0.0.1:{agent_port}/session/"
    )
    assert AGENT_WORDS in entry["lastError"] and "***" in entry["lastError"]
    assert (entry["errorKind"], entry["errorStatus"]) == ("agent_error", 500)
    assert_no_secret(staff.content.decode())

    retried = clients.member.post(f"{url}{entry['id']}/retry/")
    assert retried.status_code == 200
    assert retried.json()["lastError"] == MEMBER_TEXT
    assert_nothing_of_the_agent(retried.content.decode(), agent_port)


@pytest.fixture
def layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    with override_settings(CHANNEL_LAYERS=config):
        yield config


def socket_user(pk: int, *, staff: bool) -> SimpleNamespace:
    """A scope user: staff hold every outbox permission, a member none."""
    return SimpleNamespace(
        is_active=True,
        is_authenticated=True,
        is_staff=staff,
        is_superuser=False,
        pk=pk,
        id=pk,
        has_perm=lambda perm: staff,
    )


async def frames_until_failed(comm: WebsocketCommunicator) -> list[dict]:
    """Frames up to the update that carries the failure."""
    frames = [json.loads(await comm.receive_from(5))]
    while "errorKind" not in frames[-1].get("entry", {}):
        frames.append(json.loads(await comm.receive_from(5)))
    return frames


async def test_over_the_websocket_members_read_the_kind_and_staff_the_excerpt(
    layers, leaky_settings, agent_port
):
    socks = {}
    for name, staff in (("member", False), ("staff", True)):
        comm = WebsocketCommunicator(
            URLRouter(websocket_urlpatterns), f"/ws/outbox/workspaces/{WS}/sessions/{SES}/"
        )
        comm.scope["user"] = socket_user(len(socks) + 1, staff=staff)
        assert (await comm.connect())[0]
        assert json.loads(await comm.receive_from(5))["type"] == "queue.snapshot"
        socks[name] = comm
    await aaccept(get_outbox(), "k1", "hi", ws=WS, ses=SES)
    await deliver_to_the_leaky_agent(agent_port)
    updates = {name: await frames_until_failed(comm) for name, comm in socks.items()}
    snapshots = {}
    for name, comm in socks.items():  # a snapshot of the failed entry
        await comm.send_to(text_data='{"type": "resync"}')
        snapshots[name] = json.loads(await comm.receive_from(5))
        await comm.disconnect()
    await get_outbox().aclose()
    layer = get_channel_layer()
    await layer.flush()
    await layer.close_pools()

    member = [updates["member"][-1]["entry"], snapshots["member"]["entries"][0]]
    assert [(e["lastError"], e["errorKind"], e["errorStatus"]) for e in member] == [
        (MEMBER_TEXT, "agent_error", 500)
    ] * 2
    assert_nothing_of_the_agent(json.dumps([updates["member"], snapshots["member"]]), agent_port)
    staff = [updates["staff"][-1]["entry"], snapshots["staff"]["entries"][0]]
    for entry in staff:
        assert entry["lastError"].startswith("ambiguous: opencode answered HTTP 500 for http://")
        assert AGENT_WORDS in entry["lastError"]
        assert (entry["errorKind"], entry["errorStatus"]) == ("agent_error", 500)
    assert_no_secret(json.dumps([updates["staff"], snapshots["staff"]]))


@pytest.mark.django_db
def test_the_admin_and_the_worker_log_show_the_excerpt_without_secrets(
    admin_client, leaky_settings, agent_port, caplog
):
    entry = accept(get_outbox(), "k1", "hi", ws=WS, ses=SES)
    with caplog.at_level(logging.INFO, logger="django_outbox"):
        asyncio.run(deliver_to_the_leaky_agent(agent_port))
    assert AGENT_WORDS in caplog.text and "HTTP 500" in caplog.text
    assert_no_secret(caplog.text)
    ref = admin_quote(f"{WS}/{SES}/{entry.id}")
    detail = admin_client.get(reverse("admin:django_outbox_outboxentry_change", args=[ref]))
    listing = admin_client.get("/admin/django_outbox/outboxentry/", {"status": "all"})
    for page in (detail, listing):
        assert page.status_code == 200
        text = page.content.decode()
        assert f"127.0.0.1:{agent_port}" in text  # staff read where it failed
        assert_no_secret(text)
    assert AGENT_WORDS in detail.content.decode()
