"""The outbox admin (django_outbox/admin/): pages read from Valkey, actions, history."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from django_outbox.core.entry import Entry, Status, format_time
from django_outbox.core.scripts import seed_argv
from django_outbox.core.worker import Worker
from django_outbox.models import OutboxEntry
from tests.support.admin import (
    ALL_PERMS,
    CHANGELIST,
    accept,
    detail_url,
    fail_once,
    hold_lease,
    login,
    page_link,
    post_action,
    seed,
    staff,
    texts,
)
from tests.support.helpers import QUICK_PASSWORD_HASHERS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    """No test here is about password hashing: its users are made with a quick hasher."""
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


HOSTILE = "<script>alert(1)</script> \"double\" 'single' \u202eevil\u202c & more"


# --- helpers --------------------------------------------------------------------------


@pytest.fixture
def failing(make_outbox):
    return make_outbox(max_attempts=1)


@pytest.fixture
def operator(django_user_model):
    return login(staff(django_user_model, *ALL_PERMS))


# --- access -----------------------------------------------------------------------------


def test_the_model_gives_real_permissions_and_no_table():
    ct = ContentType.objects.get_for_model(OutboxEntry, for_concrete_model=False)
    codenames = set(Permission.objects.filter(content_type=ct).values_list("codename", flat=True))
    assert codenames == {*ALL_PERMS, "add_outboxentry"}  # add: accept over REST
    assert OutboxEntry._meta.managed is False


@pytest.mark.parametrize("url", [CHANGELIST, CHANGELIST + "ws_2Fses_2Fe1/change/"])
def test_anonymous_is_sent_to_the_login_page(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_non_staff_is_refused_even_with_permissions(django_user_model):
    client = login(staff(django_user_model, *ALL_PERMS, staff=False))
    response = client.get(CHANGELIST)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    response = client.post(CHANGELIST, {"action": "retry_entries"})
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_view_permission_is_forbidden(django_user_model, outbox):
    client = login(staff(django_user_model, "retry_outboxentry"))
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(detail_url("ws/ses/e1")).status_code == 403


def test_admin_index_links_the_outbox(admin_client):
    response = admin_client.get("/admin/")
    assert response.status_code == 200
    assert CHANGELIST in response.content.decode()


def test_actions_are_csrf_protected(django_user_model, outbox):
    entry = accept(outbox, "ws", "ses")
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff(django_user_model, *ALL_PERMS))
    response = client.post(
        CHANGELIST, {"action": "dismiss_entries", "_selected_action": f"ws/ses/{entry.id}"}
    )
    assert response.status_code == 403
    assert [e.id for e in outbox.list("ws", "ses")] == [entry.id]


# --- the list -------------------------------------------------------------------------------


def test_default_view_shows_what_needs_attention(admin_client, outbox, failing):
    accept(failing, "ws1", "broken", "will fail")
    fail_once(failing, "ws1", "broken", "agent said no")
    quiet = accept(outbox, "ws1", "quiet", "just pending")
    accept(outbox, "ws2", "parked", "to park")
    outbox.park_workspace("ws2", "maintenance")

    page = admin_client.get(CHANGELIST).content.decode()
    assert "will fail" in page and "agent said no" in page
    assert "to park" in page and "maintenance" in page
    assert "just pending" not in page
    assert "Sessions needing attention: 2" in page

    everything = admin_client.get(CHANGELIST, {"status": "all"}).content.decode()
    assert "just pending" in everything and "will fail" in everything

    pending = admin_client.get(CHANGELIST, {"status": "pending"}).content.decode()
    assert quiet.id in pending and "will fail" not in pending and "to park" not in pending

    errors = admin_client.get(CHANGELIST, {"status": "error"}).content.decode()
    assert "will fail" in errors and "to park" not in errors


def test_blocked_entries_show_the_lease_holder_and_time_in_flight(admin_client, outbox):
    first = accept(outbox, "ws", "ses", "first")
    second = accept(outbox, "ws", "ses", "second")
    hold_lease(outbox, "ws", "ses", token="holder42abcdef")

    response = admin_client.get(CHANGELIST, {"status": "blocked"})
    rows = {row.entry.id: row for row in response.context["rows"]}
    assert set(rows) == {second.id}
    assert rows[second.id].state == "blocked"
    assert rows[second.id].lease.startswith("holder42")
    assert rows[second.id].in_flight_for.endswith(" s")

    # The attention view shows the blocker beside what it blocks.
    rows = {r.entry.id: r for r in admin_client.get(CHANGELIST).context["rows"]}
    assert rows[first.id].state == "delivering" and rows[second.id].state == "blocked"
    assert rows[first.id].in_flight_for


def test_hostile_text_is_escaped_in_list_and_detail(admin_client, failing):
    entry = accept(failing, "ws", "ses", HOSTILE, cmid="hostile")
    fail_once(failing, "ws", "ses", HOSTILE)

    for url in (CHANGELIST, detail_url(f"ws/ses/{entry.id}")):
        page = admin_client.get(url).content.decode()
        assert "<script>alert(1)</script>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "\"double\" 'single'" not in page
        assert "&quot;double&quot; &#x27;single&#x27;" in page
        assert "\u202e" not in page  # the override cannot reorder the page
        assert "\\u202eevil\\u202c" in page


def test_hostile_reason_is_escaped(admin_client, outbox):
    accept(outbox, "ws", "ses", "text")
    outbox.park_workspace("ws", "<img src=x onerror=alert(1)>")
    page = admin_client.get(CHANGELIST).content.decode()
    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_detail_shows_pretty_json_and_history(admin_client, outbox):
    entry = outbox.accept(
        "ws",
        "ses",
        user_id="u1",
        client_message_id="c1",
        text="hi",
        model={"a": [], "n": 12345678901234567},
    )
    ref = f"ws/ses/{entry.id}"
    response = admin_client.get(detail_url(ref))
    assert response.status_code == 200
    shown = response.context["pretty_json"]
    assert json.loads(shown) == json.loads(entry.to_json())
    assert '\n  "model": {\n    "a": [],\n    "n": 12345678901234567\n  }' in shown
    assert "Nothing was done to this entry" in response.content.decode()

    post_action(admin_client, "retry_entries", [ref])
    post_action(admin_client, "dismiss_entries", [ref])
    response = admin_client.get(detail_url(ref))
    assert response.status_code == 404  # gone from Valkey, history kept
    page = response.content.decode()
    assert "is not in session ws/ses any more" in page
    assert "Retried from the admin" in page and "Dismissed from the admin" in page


def test_detail_of_a_bad_reference_is_404(admin_client):
    assert admin_client.get(CHANGELIST + "nope/change/").status_code == 302  # a workspace
    assert admin_client.get(detail_url("a/b")).status_code == 404
    assert admin_client.get(detail_url("a/b c/d")).status_code == 404


def test_log_entries_link_back_to_the_admin(admin_client, outbox):
    entry = accept(outbox, "ws", "ses")
    post_action(admin_client, "dismiss_entries", [f"ws/ses/{entry.id}"])
    log = LogEntry.objects.get()
    assert log.get_admin_url() == detail_url(f"ws/ses/{entry.id}")
    assert admin_client.get(log.get_admin_url()).status_code == 404  # dismissed, history shown


# --- search -----------------------------------------------------------------------------------


def test_search_by_workspace_session_and_entry(admin_client, outbox):
    a = accept(outbox, "alpha", "s1", "alpha one")
    b = accept(outbox, "alpha", "s2", "alpha two")
    c = accept(outbox, "beta", "s1", "beta one")

    def ids(**params):
        response = admin_client.get(CHANGELIST, {"status": "all", **params})
        assert response.status_code == 200
        return {row.entry.id for row in response.context["rows"]}

    assert ids(q="alpha") == {a.id, b.id}
    assert ids(q="s1") == {a.id, c.id}  # a session ID, in every workspace
    assert ids(q="alpha/s2") == {b.id}
    assert ids(q="alpha s1") == {a.id}
    assert ids(q=f"alpha/s1/{a.id}") == {a.id}
    assert ids(q=f"alpha/{b.id}") == {b.id}  # an entry ID within a workspace
    assert ids(q=c.id) == {c.id}  # an entry ID alone: looked up in the page's sessions
    assert ids(q="nothing-here") == set()
    assert ids(q="bad:id{x}") == set()  # never reaches a key
    assert ids(q="a/b/c/d") == set()


def test_search_respects_the_status_filter(admin_client, outbox, failing):
    accept(failing, "alpha", "bad", "failing one")
    fail_once(failing, "alpha", "bad")
    accept(outbox, "alpha", "fine", "fine one")
    response = admin_client.get(CHANGELIST, {"q": "alpha"})
    assert [row.text for row in response.context["rows"]] == ["failing one"]
    assert "Workspace alpha" in response.content.decode()  # the workspace tools


# --- actions ------------------------------------------------------------------------------------


def test_retry_rearms_and_logs(operator, failing):
    entry = accept(failing, "ws", "ses")
    fail_once(failing, "ws", "ses")
    assert failing.list("ws", "ses")[0].status is Status.ERROR
    ref = f"ws/ses/{entry.id}"

    response = post_action(operator, "retry_entries", [ref])
    assert response.status_code == 200
    assert any("Re-armed 1 entry" in m for m in texts(response))
    assert failing.list("ws", "ses")[0].status is Status.PENDING
    log = LogEntry.objects.get()
    assert (log.object_id, log.action_flag) == (ref, CHANGE)
    assert log.content_type == ContentType.objects.get_for_model(OutboxEntry)
    assert log.object_repr == f"entry {entry.id} of ws/ses"


def test_dismiss_removes_and_logs(operator, outbox):
    entry = accept(outbox, "ws", "ses")
    response = post_action(operator, "dismiss_entries", [f"ws/ses/{entry.id}"])
    assert any("Dismissed 1 entry" in m for m in texts(response))
    assert outbox.list("ws", "ses") == []
    assert LogEntry.objects.get().action_flag == DELETION


@pytest.mark.parametrize("action", ["retry_entries", "dismiss_entries"])
def test_busy_is_reported_and_not_logged(operator, outbox, action):
    entry = accept(outbox, "ws", "ses")
    hold_lease(outbox, "ws", "ses")
    response = post_action(operator, action, [f"ws/ses/{entry.id}"])
    (message,) = texts(response)
    assert message.startswith("Busy, not ")
    assert "live lease" in message
    assert outbox.list("ws", "ses")[0].status is Status.DELIVERING
    assert not LogEntry.objects.exists()


def test_busy_with_a_seeded_lease(operator, outbox, r):
    seed(outbox, "ws", "ses", "e1", status=Status.DELIVERING)
    r.set("outboxlock:{ws}:ses", f"tok {int(time.time() * 1000)} e1", px=30_000)
    (message,) = texts(post_action(operator, "dismiss_entries", ["ws/ses/e1"]))
    assert message.startswith("Busy, not dismissed (1): ws/ses/e1")


@pytest.mark.parametrize("action", ["retry_entries", "dismiss_entries"])
def test_not_found_is_reported(operator, outbox, action):
    response = post_action(operator, action, ["ws/ses/missing1"])
    (message,) = texts(response)
    assert message.startswith("Not found (1): ws/ses/missing1")
    assert not LogEntry.objects.exists()


def test_a_long_report_names_ten_entries_and_counts_the_rest(operator, outbox):
    """An action's report names at most ten references and counts the others: ten are
    all named, eleven name ten "and 1 more" (docs/reference/admin.md)."""
    ten = [f"ws/ses/missing{i:02d}" for i in range(10)]
    (message,) = texts(post_action(operator, "dismiss_entries", ten))
    assert message.startswith(f"Not found (10): {', '.join(ten)} \u2014")
    assert "more" not in message
    eleven = [*ten, "ws/ses/missing10"]
    (message,) = texts(post_action(operator, "dismiss_entries", eleven))
    assert message.startswith(f"Not found (11): {', '.join(sorted(eleven)[:10])} and 1 more")


def test_malformed_references_are_refused(operator, outbox):
    response = post_action(operator, "retry_entries", ["ws/ses", "ws/s{x}/e1"])
    assert all("not an entry reference" in m for m in texts(response))


def test_no_selection_changes_nothing(operator):
    response = post_action(operator, "retry_entries")
    assert any("Items must be selected" in m for m in texts(response))


PERMISSION_OF = {
    "retry_entries": "retry_outboxentry",
    "dismiss_entries": "dismiss_outboxentry",
    "park_workspaces": "park_workspace",
    "unpark_workspaces": "park_workspace",
    "cleanup_workspaces": "cleanup_workspace",
}


@pytest.mark.parametrize("action", sorted(PERMISSION_OF))
def test_each_action_needs_its_permission(django_user_model, outbox, action):
    entry = accept(outbox, "ws", "ses")
    others = [p for p in ALL_PERMS if p != PERMISSION_OF[action]]
    client = login(staff(django_user_model, *others))
    page = client.get(CHANGELIST, {"status": "all"}).content.decode()
    assert f'value="{action}"' not in page  # not offered
    data = {"_selected_action": f"ws/ses/{entry.id}", "post": "yes", "reason": "r"}
    response = client.post(CHANGELIST, {"action": action, **data})
    assert response.status_code == 403
    assert [(e.id, e.status) for e in outbox.list("ws", "ses")] == [(entry.id, Status.PENDING)]
    assert not LogEntry.objects.exists()
    # ... and it works with the permission.
    allowed = login(staff(django_user_model, "view_outboxentry", PERMISSION_OF[action]))
    assert allowed.post(CHANGELIST, {"action": action, **data}).status_code in (200, 302)


@pytest.mark.parametrize("reason", ["maint\u202enuf", "maint\x00x", "main\u200bt"])
def test_a_park_reason_with_control_or_format_characters_is_refused_by_the_form(
    operator, outbox, reason
):
    """The form says why, and nothing is parked (the rule the REST API and the core share)."""
    e1 = accept(outbox, "ws", "s1", "one")
    form = {"action": "park_workspaces", "_selected_action": [f"ws/s1/{e1.id}"], "post": "yes"}
    response = operator.post(CHANGELIST, {**form, "reason": reason})
    assert response.status_code == 200
    assert response.templates[0].name == "django_outbox/admin/park_workspace.html"
    assert "must not contain control or format characters" in response.content.decode()
    assert outbox.list("ws", "s1")[0].status is Status.PENDING
    assert not LogEntry.objects.exists()


def test_park_asks_for_a_reason_then_parks(operator, outbox):
    e1 = accept(outbox, "ws", "s1", "one")
    accept(outbox, "ws", "s2", "two")
    accept(outbox, "other", "s1", "untouched")
    response = operator.post(
        CHANGELIST, {"action": "park_workspaces", "_selected_action": [f"ws/s1/{e1.id}"]}
    )
    assert response.status_code == 200
    assert response.templates[0].name == "django_outbox/admin/park_workspace.html"
    page = response.content.decode()
    assert "ws (2 sessions)" in page and 'name="reason"' in page and "csrfmiddlewaretoken" in page
    assert outbox.list("ws", "s1")[0].status is Status.PENDING  # nothing yet

    form = {"action": "park_workspaces", "_selected_action": [f"ws/s1/{e1.id}"], "post": "yes"}
    response = operator.post(CHANGELIST, {**form, "reason": "  "})
    assert response.status_code == 200 and "This field is required" in response.content.decode()

    response = operator.post(CHANGELIST, {**form, "reason": "maintenance"}, follow=True)
    assert texts(response) == [
        "Parked workspace ws with reason 'maintenance': 2 entries parked; prompts accepted "
        "into it are held until it is unparked."
    ]
    assert {e.status for s in ("s1", "s2") for e in outbox.list("ws", s)} == {Status.PARKED}
    assert outbox.list("other", "s1")[0].status is Status.PENDING
    log = LogEntry.objects.get()
    assert (log.object_id, log.action_flag) == ("ws", CHANGE)
    assert "maintenance" in log.change_message

    response = post_action(operator, "unpark_workspaces", workspaces=["ws"])
    assert any("Unparked 2 entries of workspace ws" in m for m in texts(response))
    assert outbox.list("ws", "s1")[0].status is Status.PENDING
    response = post_action(operator, "unpark_workspaces", workspaces=["ws"])
    assert texts(response) == ["Nothing to unpark in workspace ws."]
    assert LogEntry.objects.count() == 2


def test_parking_a_workspace_with_nothing_queued_says_it_paused_it(operator, outbox):
    """Nothing to hold now, but the workspace is paused: the message says so (not "nothing
    to park"), the LogEntry records it, and the next prompt is held."""
    response = post_action(
        operator, "park_workspaces", workspaces=["quiet"], post="yes", reason="deploy"
    )
    assert texts(response) == [
        "Parked workspace quiet with reason 'deploy': no entry was pending, verifying or "
        "delivering; prompts accepted into it are held until it is unparked."
    ]
    log = LogEntry.objects.get()
    assert (log.object_id, log.action_flag) == ("quiet", CHANGE)
    assert "deploy" in log.change_message
    held = accept(outbox, "quiet", "s1", "after the park")
    assert (held.status, held.reason) == (Status.PARKED, "deploy")


def test_cleanup_confirms_what_it_deletes(operator, outbox, r):
    for i in range(3):
        accept(outbox, "ws", "s1", f"one {i}")
    accept(outbox, "ws", "s2", "two")
    accept(outbox, "keep", "s1", "kept")
    response = operator.post(CHANGELIST, {"action": "cleanup_workspaces", "workspace": "ws"})
    assert response.status_code == 200
    summary = response.context["summary"]
    assert [(w["workspace_id"], w["session_count"], w["entry_count"]) for w in summary] == [
        ("ws", 2, 4)
    ]
    page = response.content.decode()
    assert "Session s1: 3 entries" in page and "Session s2: 1 entry" in page
    assert "Entries: 4" in page and "Yes, I\u2019m sure" in page
    assert outbox.list("ws", "s1")  # nothing deleted yet

    response = operator.post(
        CHANGELIST, {"action": "cleanup_workspaces", "workspace": "ws", "post": "yes"}, follow=True
    )
    assert any("Deleted the outbox data of workspace ws" in m for m in texts(response))
    assert outbox.list("ws", "s1") == [] and outbox.list("ws", "s2") == []
    assert not r.keys("*{ws}*")
    assert outbox.list("keep", "s1")
    log = LogEntry.objects.get()
    assert (log.object_id, log.action_flag) == ("ws", DELETION)

    response = operator.post(
        CHANGELIST, {"action": "cleanup_workspaces", "workspace": "ws", "post": "yes"}, follow=True
    )
    assert texts(response) == ["Workspace ws had nothing to delete."]


def test_retry_from_the_detail_page_returns_there(operator, failing):
    entry = accept(failing, "ws", "ses")
    fail_once(failing, "ws", "ses")
    ref = f"ws/ses/{entry.id}"
    page = operator.get(detail_url(ref)).content.decode()
    assert 'value="retry_entries"' in page and 'value="dismiss_entries"' in page
    response = operator.post(
        CHANGELIST,
        {"action": "retry_entries", "_selected_action": ref, "next": detail_url(ref)},
    )
    assert response.status_code == 302 and response["Location"] == detail_url(ref)
    response = operator.post(
        CHANGELIST,
        {"action": "retry_entries", "_selected_action": ref, "next": "https://evil.example/"},
    )
    assert response["Location"] == CHANGELIST


# --- the panel ------------------------------------------------------------------------------------


def test_workers_panel_shows_live_workers(admin_client, outbox, r):
    async def noop(entry, **kwargs):
        return None

    worker = Worker(outbox, noop, concurrency=3, tick=1, stop=asyncio.Event(), worker_id="w-live")

    async def beat():
        try:
            await worker.beat()
        finally:
            await outbox.aclose()

    asyncio.run(beat())
    r.zadd("outboxworkers", {"w-gone": int(time.time() * 1000) - 60_000})

    response = admin_client.get(CHANGELIST)
    workers = {w.id: w for w in response.context["page"].workers}
    assert workers["w-live"].live and workers["w-live"].concurrency == 3
    assert not workers["w-gone"].live
    page = response.content.decode()
    assert "w-live" in page and "0/3 in flight" in page and "w-gone" in page


def test_unreachable_valkey_is_a_clear_503(admin_client, monkeypatch):
    from django_outbox import conf
    from django_outbox.outbox import reset_outbox

    monkeypatch.setenv("OUTBOX_VALKEY_URL", "redis://127.0.0.1:9/0")
    conf.reset()
    reset_outbox()
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 503
    assert "Valkey cannot be read" in response.content.decode()
    response = admin_client.post(
        CHANGELIST, {"action": "retry_entries", "_selected_action": "ws/ses/e1"}, follow=True
    )
    assert any(m.startswith("Nothing was done: ") for m in texts(response))


# --- scale ----------------------------------------------------------------------------------------


class CallCounter:
    """Counts round trips and commands sent by redis-py's sync clients."""

    def __init__(self, monkeypatch) -> None:
        self.round_trips = 0
        self.commands = 0
        execute_command = redis.Redis.execute_command
        pipeline_execute = redis.client.Pipeline.execute

        def counted_command(client, *args, **options):
            self.round_trips += 1
            self.commands += 1
            return execute_command(client, *args, **options)

        def counted_pipeline(pipe, raise_on_error=True):
            self.round_trips += 1
            self.commands += len(pipe.command_stack)
            return pipeline_execute(pipe, raise_on_error)

        monkeypatch.setattr(redis.Redis, "execute_command", counted_command)
        monkeypatch.setattr(redis.client.Pipeline, "execute", counted_pipeline)

    def measure(self, fn):
        before = (self.round_trips, self.commands)
        result = fn()
        return result, (self.round_trips - before[0], self.commands - before[1])


def seed_sessions(outbox, start: int, stop: int, workspaces: int = 20) -> None:
    pipe = outbox.client.pipeline(transaction=False)
    now = format_time(int(time.time() * 1_000_000))
    script = outbox.scripts["seed"]
    outbox.client.script_load(script.text)
    for i in range(start, stop):
        ws, ses = f"ws{i % workspaces}", f"s{i}"
        raw = Entry(
            id=f"e{i}", client_message_id="c", user_id="u", text=f"text {i}", accepted_at=now
        ).to_json()
        keys, args = outbox._session_args(outbox.keys.session(ws, ses), ws, ses)
        pipe.evalsha(script.sha, len(keys), *keys, *args, *seed_argv(raw, f"e{i}", False))
        if len(pipe.command_stack) >= 1000:
            pipe.execute()
    pipe.execute()
    for w in range(workspaces):  # every session needs attention now
        outbox.park_workspace(f"ws{w}", "scale")


def commandstats(r) -> int:
    stats = r.info("commandstats")
    return sum(
        v["calls"] for k, v in stats.items() if not k.startswith(("cmdstat_info", "cmdstat_config"))
    )


def test_a_page_costs_the_same_for_100_and_10000_sessions(admin_client, outbox, r, monkeypatch):
    """The first page and the next one (read after the last session shown) cost the
    same round trips and commands whatever the number of sessions (sessions parked in
    one round trip mostly share their millisecond, so the next page starts among
    equal scores)."""
    seed_sessions(outbox, 0, 100)
    counter = CallCounter(monkeypatch)
    admin_client.get(CHANGELIST)  # warm up: loads the snapshot script once

    measured = {}
    for size in (100, 10_000):
        if size == 10_000:
            seed_sessions(outbox, 100, 10_000)
        for status in ("attention", "all"):
            r.config_resetstat()
            response, calls = counter.measure(
                lambda status=status: admin_client.get(CHANGELIST, {"status": status})
            )
            assert response.status_code == 200
            assert len(response.context["rows"]) == 50
            assert response.context["page"].total == size
            measured[size, status, "first"] = (*calls, commandstats(r))
            r.config_resetstat()
            following, calls = counter.measure(
                lambda response=response: admin_client.get(page_link(response, "next"))
            )
            assert len(following.context["rows"]) == 50
            assert following.context["page"].offset == 50
            measured[size, status, "next"] = (*calls, commandstats(r))

    print("valkey calls (round trips, commands sent, commands run on the server):", measured)
    for status in ("attention", "all"):
        for which, index_commands in (("first", 5), ("next", 6)):
            assert measured[100, status, which] == measured[10_000, status, which]
            round_trips, commands, server_commands = measured[10_000, status, which]
            assert round_trips == 2  # index page + counts, then sessions + heartbeats
            # The first page: ZRANGE, SCARD, ZCARD x2 (the totals, the index's among
            # them), the workers' ZRANGE; the next one also counts what lies before it.
            assert commands == index_commands + 50  # and one snapshot per session
            # a snapshot runs TIME (the server's clock), GET, LRANGE x3 (the queue, the
            # staging list, how recent entries ended), GET, PTTL
            assert server_commands == index_commands + 50 * 8


def test_detail_of_a_parked_entry_says_it_waits_for_unpark(admin_client, outbox):
    entry = outbox.accept("ws", "ses", user_id="u1", client_message_id="c1", text="hi")
    outbox.park_workspace("ws", "maintenance")
    page = admin_client.get(detail_url(f"ws/ses/{entry.id}")).content.decode()
    assert "held until the workspace is unparked" in page
    assert "due now" not in page


def test_detail_of_a_held_entry_shows_its_holds_in_a_row(admin_client, make_outbox):
    from django_outbox.errors import HoldDeliveryError

    async def busy(entry, **kwargs):
        raise HoldDeliveryError("HTTP 429", retry_after=60)

    outbox = make_outbox(deliverer=busy)
    entry = outbox.accept("ws", "ses", user_id="u1", client_message_id="c1", text="hi")

    async def step():
        await outbox.adeliver_once("ws", "ses")
        await outbox.aclose()

    asyncio.run(step())
    page = admin_client.get(detail_url(f"ws/ses/{entry.id}")).content.decode()
    assert "transient failures 0, holds in a row 1)" in page
    assert "held for 60s" in page


def test_a_session_search_says_when_an_owed_signal_waits_for_staff(admin_client, outbox, r):
    """docs/reference/signals.md#a-receiver-that-keeps-failing"""
    accept(outbox, "w1", "s1")
    r.hset(outbox.keys.owed_failures("w1", "s1"), mapping={"e-held": 5, "e-trying": 1})
    page = admin_client.get("/admin/django_outbox/outboxentry/?q=w1/s1").content.decode()
    assert "The entry_delivered of e-held failed 5 times and this session waits" in page
    assert "manage.py outbox owed w1 s1 e-held --retry" in page
    assert "e-trying" not in page


def test_the_cleanup_page_lists_200_sessions_and_counts_the_rest(operator, outbox):
    """The cleanup confirmation lists a workspace's first 200 sessions and counts the
    others; its totals stay exact (docs/reference/admin.md)."""
    seed_sessions(outbox, 0, 200, workspaces=1)
    ask = {"action": "cleanup_workspaces", "workspace": "ws0"}
    page = operator.post(CHANGELIST, ask).content.decode()
    assert "Workspace ws0: 200 sessions" in page and page.count("<li>Session s") == 200
    assert "more session" not in page
    seed_sessions(outbox, 200, 201, workspaces=1)
    page = operator.post(CHANGELIST, ask).content.decode()
    assert "Workspace ws0: 201 sessions" in page and "\u2026 and 1 more session<" in page
    assert page.count("<li>Session s") == 200
    assert outbox.list("ws0", "s200")  # nothing deleted
