"""outbox.js's one-line wire rules under Node (tests/support/node.py): a ``Retry-After``
is read in seconds (and capped at five times the longest backoff), and a socket the
server closed for a frame it refuses (1003 binary, 1009 too big) is not reopened
(docs/reference/javascript.md, docs/reference/websocket.md)."""

from __future__ import annotations

import pytest

from tests.support.node import run_node

RETRY_AFTER = r"""
for (const header of ["1", "60"]) {
  const log = [];
  let retrying = null;
  const seen = new Promise((resolve) => { retrying = resolve; });
  const ob = make(
    [{ status: 503, headers: { "Retry-After": header }, body: { code: "unavailable" } }],
    log,
    {
      backoff: { initial: 1, max: 400 },
      onEvent: (e) => { if (e.type === "retrying") retrying(e.retryIn); },
    },
  );
  ob.send("w", "ses_1", "hi").catch(() => {});
  results[header] = await seen;
  ob.close();
}
console.log(JSON.stringify(results));
process.exit(0);
"""


def test_retry_after_is_read_in_seconds_and_capped(tmp_path):
    """A 503 with ``Retry-After: 1`` waits a second (not a millisecond); one with
    ``Retry-After: 60`` waits at most five times ``backoff.max`` (400 ms here)."""
    r = run_node(tmp_path, RETRY_AFTER)
    assert 1000 <= r["1"] <= 2000
    assert r["60"] == 2000


REFUSED_FRAMES = r"""
{
  const code = CODE;
  const views = [];
  const ob = make([], []);
  const before = FakeWS.all.length;
  const sub = ob.subscribe("w", "ses_1", (v) => views.push(v));
  await until(() => FakeWS.all.length === before + 1);
  const ws = FakeWS.all.at(-1);
  ws.frame({ type: "queue.snapshot", version: 1, entries: [] });
  ws.drop(code);
  await sleep(30);
  const last = views.at(-1);
  results.closed = {
    sockets: FakeWS.all.length - before, error: last.error?.code,
    closeCode: last.error?.closeCode,
  };
  sub.close();
  ob.close();
}
console.log(JSON.stringify(results));
process.exit(0);
"""


@pytest.mark.parametrize("code", [1003, 1009])
def test_a_socket_closed_for_a_refused_frame_is_not_reopened(tmp_path, code):
    """1003 (a binary frame) and 1009 (a frame over the server's bound) say the page sent
    what the server never takes: reconnecting would repeat it, so the view stops with
    ``error.code == "refused"``."""
    r = run_node(tmp_path, REFUSED_FRAMES.replace("CODE", str(code)))
    assert r["closed"] == {"sockets": 1, "error": "refused", "closeCode": code}
