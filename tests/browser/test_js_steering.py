"""outbox.js's steering calls under Node: send() options, edit, move, cancel
(docs/howto/steering.md); the harness is tests/support/node.py."""

from __future__ import annotations

from tests.support.node import run_node

STEERING = r"""
{
  const log = [];
  const answers = [
    { status: 202, body: { id: "e1", text: "hi", mode: "reject" } },
    { status: 200, body: { id: "e1", text: "better" } },
    { status: 200, body: { id: "e1" } },
    { status: 204 },
    { status: 412, body: { code: "version_mismatch", detail: "stale" } },
  ];
  const fetch = async (url, init) => {
    log.push([init.method, url, init.body ? JSON.parse(init.body) : null,
              init.headers["If-Match"] || null]);
    const a = answers.shift();
    return {
      status: a.status, ok: a.status < 300, redirected: false,
      headers: { get: () => null },
      json: async () => a.body ?? null,
    };
  };
  const ob = createOutbox({ ...fast, storage: newStorage(), fetch });
  await ob.send("w", "s", "hi", { ifBusy: "reject", expiresAfter: 30 });
  await ob.edit("w", "s", "e1", { text: "better" }, { version: 41 });
  await ob.move("w", "s", "e1", { to: "next" });
  await ob.cancel("w", "s", "e1");
  let err = null;
  try {
    await ob.edit("w", "s", "e1", { text: "x" }, { version: 1 });
  } catch (e) {
    err = [e.status, e.code];
  }
  results.calls = log;
  results.err = err;
  ob.close();
}
console.log(JSON.stringify(results));
process.exit(0);
"""


def test_outbox_js_sends_options_and_steers_queued_prompts(tmp_path):
    r = run_node(tmp_path, STEERING)
    base = "/outbox/api/workspaces/w/sessions/s/messages/"
    [accept, edit, move, cancel, stale] = r["calls"]
    assert accept[0:2] == ["POST", base]
    assert (accept[2]["ifBusy"], accept[2]["expiresAfter"]) == ("reject", 30)
    assert edit == ["PATCH", f"{base}e1/", {"text": "better"}, '"41"']
    assert move == ["POST", f"{base}e1/move/", {"to": "next"}, None]
    assert cancel == ["POST", f"{base}e1/cancel/", None, None]
    assert stale[3] == '"1"' and r["err"] == [412, "version_mismatch"]
