"""The LangGraph backend's outcome table (docs/howto/langgraph.md#outcomes) where the
server or the network misbehaves: a run created whose answer is lost on the way back
(a real ``langgraph dev`` behind a loopback proxy that drops that reply), and a small
real HTTP server that answers the statuses and bodies a broken or hostile server would.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from django_outbox import Verdict
from django_outbox.delivery.langgraph import (
    ENTRY_KEY,
    LangGraphClient,
    LangGraphError,
    LangGraphHTTPError,
    thread_id_for,
)
from django_outbox.errors import AmbiguousError, TransientDeliveryError
from tests.support.helpers import WS, accept, make_entry
from tests.support.langgraph_server import ASSISTANT, LangGraphServer
from tests.support.proxy import TcpProxy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    lg = LangGraphServer(tmp_path_factory.mktemp("langgraph")).start()
    yield lg
    lg.stop()


async def test_a_run_created_whose_answer_is_lost_is_verified_never_sent_twice(server, make_outbox):
    """The server creates the run, then the connection drops before its answer arrives:
    ambiguous, and the verifier finds the run, so the prompt is on the thread once."""
    proxy = TcpProxy(server.port).start()
    lg = LangGraphClient(f"http://127.0.0.1:{proxy.port}", ASSISTANT, timeout=30)
    outbox = make_outbox(deliverer=lg.deliver, verifier=lg.verify, verify_delay=0)
    ses = "lg-lost-answer"
    thread = thread_id_for(WS, ses)
    entry = accept(outbox, "k1", "answer lost", ses=ses)
    try:
        proxy.drop_reply_to(f"/threads/{thread}/runs HTTP/1.1".encode())
        assert await outbox.adeliver_once(WS, ses)
        assert proxy.dropped == 1
        [pending] = await outbox.alist(WS, ses)
        assert pending.status == "verifying"
        while await outbox.alist(WS, ses):
            assert await outbox.adeliver_once(WS, ses)
    finally:
        await outbox.aclose()
        await lg.aclose()
        proxy.close()
    runs = server.runs(thread)
    assert [run["metadata"][ENTRY_KEY] for run in runs] == [entry.id]


# --- a server that answers what we tell it -----------------------------------------------


class Scripted(BaseHTTPRequestHandler):
    """Answers ``self.server.answers[(method, first path segment after the thread)]``:
    ``(status, body bytes)``; ``POST /threads`` is ``("POST", "threads")``, a run
    creation ``("POST", "runs")``, the run search ``("GET", "runs")``."""

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        parts = self.path.split("?")[0].strip("/").split("/")
        key = (self.command, "threads" if len(parts) == 1 else parts[2])
        self.server.seen.append((self.command, self.path, self.headers.get("x-api-key")))
        status, body = self.server.answers.get(key, (404, b'{"detail":"not found"}'))
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def scripted():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    httpd.answers = {("POST", "threads"): (200, b"{}")}
    httpd.seen = []
    # shutdown() waits for serve_forever's next poll: at the default 0.5 s that was most
    # of each test's time.
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


@pytest.fixture
async def scripted_client(scripted):
    lg = LangGraphClient(
        f"http://127.0.0.1:{scripted.server_address[1]}",
        ASSISTANT,
        api_key="scripted-key-" + "q" * 16,
        max_response_bytes=4096,
    )
    yield lg
    await lg.aclose()


def deliver(lg, entry):
    return lg.deliver(entry, workspace_id=WS, session_id="s", attempt=1)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_a_failing_thread_creation_is_transient_nothing_was_sent(
    scripted, scripted_client, status
):
    scripted.answers[("POST", "threads")] = (status, b'{"detail":"down"}')
    with pytest.raises(TransientDeliveryError):
        await deliver(scripted_client, make_entry())
    assert [method for method, _, _ in scripted.seen] == ["POST"]  # no run was sent


async def test_a_refused_thread_creation_is_a_definitive_failure(scripted, scripted_client):
    scripted.answers[("POST", "threads")] = (403, b'{"detail":"no"}')
    with pytest.raises(LangGraphHTTPError) as caught:
        await deliver(scripted_client, make_entry())
    assert caught.value.status == 403


@pytest.mark.parametrize(
    "answer",
    [(500, b'{"detail":"boom"}'), (504, b""), (200, b"not json"), (200, b'{"no":"run_id"}')],
)
async def test_a_run_creation_that_may_have_happened_is_ambiguous(
    scripted, scripted_client, answer
):
    scripted.answers[("POST", "runs")] = answer
    with pytest.raises(AmbiguousError):
        await deliver(scripted_client, make_entry())


async def test_a_refused_run_is_a_definitive_failure_with_a_redacted_excerpt(
    scripted, scripted_client
):
    key = scripted_client.api_key
    scripted.answers[("POST", "runs")] = (422, f'{{"detail":"bad key {key}"}}'.encode())
    with pytest.raises(LangGraphHTTPError) as caught:
        await deliver(scripted_client, make_entry())
    assert caught.value.status == 422
    assert key not in str(caught.value)
    # The key went to the server, in its header, on every request.
    assert {seen_key for _, _, seen_key in scripted.seen} == {key}


async def test_a_run_that_cannot_be_waited_for_is_ambiguous(scripted, scripted_client):
    scripted.answers[("POST", "runs")] = (200, b'{"run_id":"r1"}')
    with pytest.raises(AmbiguousError, match="was created"):
        await deliver(scripted_client, make_entry())  # the join answers 404


@pytest.mark.parametrize(
    "answer",
    [
        (500, b"{}"),
        (200, b"{}"),
        (200, b"[1]"),
        (200, b'[{"metadata": "x"}]'),
        (200, b"[" + b'{"metadata":{}},' * 400 + b"{}]"),  # over max_response_bytes
    ],
)
async def test_a_run_search_that_cannot_be_read_is_inconclusive(scripted, scripted_client, answer):
    scripted.answers[("GET", "runs")] = answer
    entry = make_entry()
    assert (
        Verdict.split(await scripted_client.verify(entry, workspace_id=WS, session_id="s"))[0]
        is Verdict.INCONCLUSIVE
    )
    with pytest.raises(LangGraphError):
        await scripted_client.abort(entry, workspace_id=WS, session_id="s")


async def test_a_run_search_without_the_entry_is_absent(scripted, scripted_client):
    scripted.answers[("GET", "runs")] = (200, json.dumps([{"metadata": {}}]).encode())
    verdict, _ = Verdict.split(
        await scripted_client.verify(make_entry(), workspace_id=WS, session_id="s")
    )
    assert verdict is Verdict.ABSENT


@pytest.mark.parametrize(
    ("history", "verdict"),
    [
        ((200, b"[]"), Verdict.ABSENT),  # cut while pending: the graph never took it
        ((200, b'[{"values": {}}]'), Verdict.DELIVERED),  # it started, then was cut
        ((500, b"{}"), Verdict.INCONCLUSIVE),
        ((200, b'{"not": "a list"}'), Verdict.INCONCLUSIVE),
        ((200, b"not json"), Verdict.INCONCLUSIVE),
    ],
)
async def test_an_interrupted_run_is_delivered_only_if_it_took_its_prompt(
    scripted, scripted_client, history, verdict
):
    """An ``interrupted`` run may have been cut before it started; the thread's history
    (checkpoints carry the run's metadata) says whether the graph took the prompt."""
    entry = make_entry()
    run = {"run_id": "r1", "status": "interrupted", "metadata": {ENTRY_KEY: entry.id}}
    scripted.answers[("GET", "runs")] = (200, json.dumps([run]).encode())
    scripted.answers[("POST", "history")] = history
    found, _ = Verdict.split(await scripted_client.verify(entry, workspace_id=WS, session_id="s"))
    assert found is verdict
    (asked,) = [path for method, path, _ in scripted.seen if path.endswith("/history")]
    assert asked == f"/threads/{thread_id_for(WS, 's')}/history"


async def test_a_run_in_another_status_is_delivered_without_reading_the_history(
    scripted, scripted_client
):
    entry = make_entry()
    for status in ("pending", "running", "success", "error", "timeout"):
        run = {"run_id": "r1", "status": status, "metadata": {ENTRY_KEY: entry.id}}
        scripted.answers[("GET", "runs")] = (200, json.dumps([run]).encode())
        verdict, _ = Verdict.split(
            await scripted_client.verify(entry, workspace_id=WS, session_id="s")
        )
        assert verdict is Verdict.DELIVERED, status
    assert not [path for _, path, _ in scripted.seen if path.endswith("/history")]
