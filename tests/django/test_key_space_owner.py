"""One project per key space: the claim on ``KEY_PREFIX`` in a Valkey database,
the check that reports another project's claim, the worker and the cleanups that refuse to
work there, taking over and releasing, and two projects side by side on one server
(docs/howto/valkey.md#one-project-per-key-space).

A second project is this test process under another ``SECRET_KEY`` (``override_settings``
rebuilds the outbox), or a worker process with a settings module written for the test.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.contrib.messages import get_messages
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import override_settings
from rest_framework.test import APIClient

from django_outbox.core.owner import Claim, ClaimResult, KeySpaceOwner
from django_outbox.errors import KeySpaceClaimed
from django_outbox.outbox import Outbox, get_outbox, key_space_owner
from django_outbox.testing import ValkeyServer
from tests.support.helpers import SES, WS, accept
from tests.support.paths import ROOT

#: The tests' own SECRET_KEY (tests/support/settings/base.py): the project this process is.
OURS = "tests-only-not-secret"
#: The settings module this process runs with: the label of the claims it makes.
LABEL = os.environ["DJANGO_SETTINGS_MODULE"]
#: The worker processes' settings (the same SECRET_KEY: the same project).
WORKER_SETTINGS = "tests.support.settings.worker"
#: Another project's (or another deployment's) SECRET_KEY.
PRODUCTION = "production-secret-key-not-for-real"
STAGING = "staging-secret-key-not-for-real"


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("outbox", *args, stdout=out)
    return out.getvalue()


def refused(*args: str) -> CommandError:
    with pytest.raises(CommandError) as raised:
        run(*args)
    return raised.value


def claim_of(r, prefix: str = "outbox") -> Claim | None:
    return Claim.parse(r.get(f"{prefix}owner"))


def foreign_claim(r, prefix: str = "outbox") -> None:
    """Another project's claim, as its outbox writes it."""
    claim = Claim("another-project", "production.settings", "prod-1", "2026-01-01T00:00:00Z")
    r.set(f"{prefix}owner", claim.to_json())


def check_ids() -> list[str]:
    return sorted(m.id for m in checks.run_checks(tags=["outbox"]) if m.is_serious())


def worker(
    tmp_path: Path, url: str, settings: str = WORKER_SETTINGS, *args: str
) -> subprocess.CompletedProcess[str]:
    """``manage.py outbox_worker --once`` in a process of its own, on ``url``."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "OUTBOX_VALKEY_URL": url,
        "DJANGO_SETTINGS_MODULE": settings,
    }
    return subprocess.run(
        [sys.executable, "-m", "django", "outbox_worker", "--once", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def project_settings(tmp_path: Path, name: str, secret: str, outbox: dict | None = None) -> str:
    """A settings module in ``tmp_path`` for another project's worker: the tests' worker
    settings with ``secret`` as its SECRET_KEY and ``outbox`` laid over its OUTBOX."""
    (tmp_path / f"{name}.py").write_text(
        f"from {WORKER_SETTINGS} import *  # noqa: F403\n"
        f"SECRET_KEY = {secret!r}\n"
        f"OUTBOX = {{**OUTBOX, **{outbox or {}!r}}}  # noqa: F405\n",
        encoding="utf-8",
    )
    return name


# --- a staging project pointed at production's key space --------------------------------


@pytest.mark.slow
def test_a_second_project_is_told_and_refuses_to_deliver_or_clean_up(valkey, tmp_path, r):
    """Production accepts three prompts; staging (a copied settings file: the same URL and
    prefix, its own SECRET_KEY) runs the only worker, then cleans up w1."""
    with override_settings(SECRET_KEY=PRODUCTION):
        production = get_outbox()
        ids = [accept(production, f"k{i}").id for i in range(3)]
    assert claim_of(r).label == LABEL

    # staging's check says so, with the fix
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    text = str(raised.value)
    assert "django_outbox.E006" in text and "claimed by another project" in text
    assert "KEY_PREFIX" in text and "database number" in text
    assert "manage.py outbox claim --force" in text and "SECRET_KEY_FALLBACKS" in text
    assert PRODUCTION not in text and OURS not in text

    # staging's worker does not start: nothing delivered, nothing recovered
    done = worker(tmp_path, valkey)
    assert done.returncode != 0, done.stdout
    assert "outbox_worker refuses to start" in done.stderr
    assert f"belongs to another project ('{LABEL}' on host" in done.stderr
    assert "outbox claim --force" in done.stderr and "Traceback" not in done.stderr
    assert r.lrange("test:log", 0, -1) == []
    assert r.zcard("outboxworkers") == 0

    # staging's cleanup deletes nothing
    with pytest.raises(KeySpaceClaimed, match="belongs to another project"):
        get_outbox().cleanup_workspace(WS)
    with override_settings(SECRET_KEY=PRODUCTION):
        assert [e.id for e in get_outbox().list(WS, SES)] == ids
        assert check_ids() == []  # production's own check is clean

    # production's worker delivers them (its settings module: production's key)
    module = project_settings(tmp_path, "production_settings", PRODUCTION)
    done = worker(tmp_path, valkey, module)
    assert done.returncode == 0, done.stderr
    assert r.lrange("test:log", 0, -1) == ["s1 k0", "s1 k1", "s1 k2"]


# --- when the claim is made, and what check does ------------------------------------------


def test_the_first_accept_claims_and_the_check_only_reads(r):
    assert check_ids() == []
    call_command("check")
    assert r.get("outboxowner") is None  # check (so migrate's checks) wrote nothing
    accept(get_outbox())
    claim = claim_of(r)
    assert claim is not None and claim.id == key_space_owner().id
    assert claim.label == LABEL and claim.host and claim.claimed_at.endswith("Z")
    assert OURS not in r.get("outboxowner")
    assert check_ids() == []


def test_check_reports_another_projects_key_space_and_not_when_unreachable(r, monkeypatch):
    foreign_claim(r)
    messages = [m for m in checks.run_checks(tags=["outbox"]) if m.is_serious()]
    assert [m.id for m in messages] == ["django_outbox.E006"]
    assert "'production.settings' on host prod-1" in messages[0].msg
    assert "another OUTBOX['KEY_PREFIX']" in messages[0].hint
    assert "redis://host:6379/1" in messages[0].hint
    # a value the outbox did not write is nobody this project can be
    r.set("outboxowner", "not a claim")
    messages = [m for m in checks.run_checks(tags=["outbox"]) if m.is_serious()]
    assert [m.id for m in messages] == ["django_outbox.E006"]
    assert "(a value django-outbox did not write)" in messages[0].msg
    # another prefix on the same database is another key space
    with override_settings(OUTBOX={"KEY_PREFIX": "staging"}):
        assert check_ids() == []
    monkeypatch.setenv("OUTBOX_VALKEY_URL", "redis://127.0.0.1:1/0")
    with override_settings(OUTBOX={}):  # (read the environment again)
        assert [m.id for m in checks.run_checks(tags=["outbox"]) if m.is_serious()] == []


def test_a_rotated_secret_key_keeps_its_key_space(r):
    accept(get_outbox(), "k1")
    before = claim_of(r).id
    with override_settings(SECRET_KEY="the-new-key-not-for-real", SECRET_KEY_FALLBACKS=[OURS]):
        assert check_ids() == []  # the old key's claim is this project's
        accept(get_outbox(), "k2")  # the first accept renews it with the new key
        renewed = key_space_owner().id
        assert claim_of(r).id == renewed != before
        assert get_outbox().cleanup_workspace(WS) > 0
    with override_settings(SECRET_KEY="the-new-key-not-for-real"):  # rotation finished
        assert check_ids() == []
    # a deployment still on the old key, without the new one, is another project now
    assert check_ids() == ["django_outbox.E006"]


def test_the_identity_is_a_keyed_digest_that_reveals_no_key():
    ours = key_space_owner()
    assert len(ours.id) == 64 and OURS not in ours.id and ours.former == ()
    with override_settings(SECRET_KEY=STAGING):
        assert key_space_owner().id != ours.id
    with override_settings(OUTBOX={"KEY_PREFIX": "staging"}):
        assert key_space_owner().id != ours.id
    with override_settings(SECRET_KEY=STAGING, SECRET_KEY_FALLBACKS=["older", OURS]):
        assert key_space_owner().former[1] == ours.id


# --- the core: worker, accept, cleanup ----------------------------------------------------


def test_a_worker_claims_an_unclaimed_key_space_and_refuses_a_claimed_one(make_outbox, r):
    mine = KeySpaceOwner("mine", label="mine.settings")
    other = KeySpaceOwner("other", label="other.settings")
    delivered: list[str] = []

    async def deliver(entry, **kwargs):
        delivered.append(entry.text)

    async def work(outbox):
        try:
            return await outbox.arun(deliver, once=True, heartbeat=False)
        finally:
            await outbox.aclose()

    first = make_outbox(key_space_owner=mine)
    accept(make_outbox(), "k1")  # (an outbox without an owner claims nothing)
    assert r.get("outboxowner") is None
    asyncio.run(work(first))
    assert delivered == ["k1"] and claim_of(r).label == "mine.settings"

    accept(make_outbox(), "k2")
    with pytest.raises(KeySpaceClaimed, match=r"'mine\.settings'"):
        asyncio.run(work(make_outbox(key_space_owner=other)))
    assert delivered == ["k1"]
    assert [e.text for e in first.list(WS, SES)] == ["k2"]


def test_accept_and_cleanup_refuse_another_projects_key_space(make_outbox, r):
    production = make_outbox(key_space_owner=KeySpaceOwner("production"))
    staging = make_outbox(key_space_owner=KeySpaceOwner("staging"))
    kept = accept(production, "k1")
    with pytest.raises(KeySpaceClaimed):
        accept(staging, "k2", ses="s2")
    with pytest.raises(KeySpaceClaimed):
        staging.cleanup_workspace(WS)
    assert [e.id for e in production.list(WS, SES)] == [kept.id]
    assert production.list(WS, "s2") == []
    # cleanup asks every time: a takeover after this process last looked is seen
    assert production.cleanup_workspace(WS) > 0
    assert staging.claim_key_space(force=True) is ClaimResult.TAKEN_OVER
    with pytest.raises(KeySpaceClaimed):
        production.cleanup_workspace(WS)


@pytest.mark.standalone
def test_a_full_valkey_still_drains_in_an_unclaimed_key_space(tmp_path):
    """The claim is a write; at maxmemory it is refused, and the cleanup and the worker go
    on (nobody else holds the space): a full Valkey must drain."""
    with ValkeyServer(tmp_path / "valkey") as server:
        filler = Outbox(url=server.url)
        for i in range(20):
            accept(filler, f"k{i}", "x" * 20_000, ws=f"w{i % 2}", ses=f"s{i % 4}")
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory", client.info("memory")["used_memory"] - 64 * 1024)
        owned = Outbox(url=server.url, key_space_owner=KeySpaceOwner("mine"))
        try:
            assert owned.claim_key_space() is ClaimResult.UNWRITTEN
            delivered: list[str] = []

            async def deliver(entry, **kwargs):
                delivered.append(entry.id)

            async def drain():
                try:
                    await owned.arun(deliver, once=True, heartbeat=False)
                finally:
                    await owned.aclose()

            assert owned.cleanup_workspace("w0") > 0
            assert owned.list("w0", "s0") == []
            asyncio.run(drain())
            assert len(delivered) == 10  # w1's: the worker started and drained
            assert client.get("outboxowner") is None
        finally:
            owned.close()
            filler.close()
            client.close()


# --- the edges: REST, admin, command line --------------------------------------------------


@pytest.mark.django_db
def test_rest_answers_503_and_changes_nothing_in_another_projects_key_space(admin_user, r, caplog):
    accept(get_outbox(), "k1")
    foreign_claim(r)
    client = APIClient()
    client.force_login(admin_user)
    base = f"/outbox/api/workspaces/{WS}/"
    for response in (
        client.delete(base),
        client.post(
            f"{base}sessions/{SES}/messages/",
            {"clientMessageID": "k2", "text": "hi"},
            format="json",
        ),
    ):
        assert response.status_code == 503, response.content
        assert response.json()["code"] == "unavailable"
        assert response.json()["accepted"] is False
        assert "production.settings" not in response.json()["detail"]
    assert [e.text for e in get_outbox().list(WS, SES)] == ["k1"]
    assert "belongs to another project ('production.settings'" in caplog.text


@pytest.mark.django_db
def test_the_admins_cleanup_says_nothing_was_done(admin_client, r):
    accept(get_outbox(), "k1")
    foreign_claim(r)
    response = admin_client.post(
        "/admin/django_outbox/outboxentry/",
        {"action": "cleanup_workspaces", "workspace": WS, "post": "yes"},
        follow=True,
    )
    assert response.status_code == 200
    texts = [str(m) for m in get_messages(response.wsgi_request)]
    assert len(texts) == 1 and texts[0].startswith("Nothing was done: the outbox key space")
    assert [e.text for e in get_outbox().list(WS, SES)] == ["k1"]


def test_the_command_line_claims_takes_over_and_releases(r):
    accept(get_outbox(), "k1")
    foreign_claim(r)
    error = refused("cleanup", WS, "--yes")
    assert error.returncode == 2
    assert "Nothing was done" in str(error) and "outbox claim --force" in str(error)
    assert refused("claim").returncode == 2
    assert refused("release").returncode == 2
    assert [e.text for e in get_outbox().list(WS, SES)] == ["k1"]

    text = run("claim", "--force")
    assert "Took key space 'outbox'" in text and "'production.settings' on host prod-1" in text
    assert claim_of(r).id == key_space_owner().id
    assert "already holds key space 'outbox'" in run("claim")
    assert "Cleaned up workspace w1" in run("cleanup", WS, "--yes")

    assert "Released key space 'outbox'" in run("release")
    assert r.get("outboxowner") is None
    assert refused("release").returncode == 1
    assert "Claimed key space 'outbox'" in run("claim")


# --- side by side ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.standalone
@pytest.mark.parametrize("apart", ["prefix", "database"])
def test_two_projects_on_one_server_work_side_by_side(valkey, tmp_path, apart):
    """Production and staging share a server: staging with its own KEY_PREFIX, or its own
    database number. Each claims its own key space, passes its check, and its worker
    delivers its own prompts only."""
    staging_url = valkey if apart == "prefix" else valkey.rsplit("/", 1)[0] + "/1"
    staging_outbox = {"KEY_PREFIX": "staging"} if apart == "prefix" else {}
    accept(get_outbox(), "k1", "production prompt")
    staging_settings = {**staging_outbox, "VALKEY_URL": staging_url}
    with override_settings(SECRET_KEY=STAGING, OUTBOX=staging_settings):
        accept(get_outbox(), "k1", "staging prompt")
        assert check_ids() == []
    assert check_ids() == []

    production = worker(tmp_path, valkey)
    assert production.returncode == 0, production.stderr
    module = project_settings(tmp_path, f"staging_{apart}", STAGING, staging_outbox)
    staging = worker(tmp_path, staging_url, module)
    assert staging.returncode == 0, staging.stderr

    main = redis.Redis.from_url(valkey, decode_responses=True)
    other = redis.Redis.from_url(staging_url, decode_responses=True)
    try:
        prefix = staging_outbox.get("KEY_PREFIX", "outbox")
        assert Claim.parse(main.get("outboxowner")).label == LABEL
        assert Claim.parse(other.get(f"{prefix}owner")).label == LABEL
        assert (
            Claim.parse(main.get("outboxowner")).id != Claim.parse(other.get(f"{prefix}owner")).id
        )
        if apart == "prefix":
            assert main.lrange("test:log", 0, -1) == ["s1 production prompt", "s1 staging prompt"]
        else:
            assert main.lrange("test:log", 0, -1) == ["s1 production prompt"]
            assert other.lrange("test:log", 0, -1) == ["s1 staging prompt"]
    finally:
        main.close()
        other.close()
