"""outbox.js's logic under Node: scripted ``fetch``, fake ``WebSocket``, fake tabs.

``django_outbox/static/django_outbox/outbox.js`` is imported by a Node script (Node 18+)
with a ``fetch`` that answers from a script, a ``WebSocket`` the script drives, and one
origin's ``localStorage`` shared by several "tabs": each tab has its own window (where
``storage`` events arrive, asynchronously, for the *other* tabs' writes) as in a browser
(the harness is tests/support/node.py). Each test runs one scenario script and asserts on
the JSON it prints. The real browser tests are in ``test_browser.py``,
``test_browser_tabs.py`` and ``test_browser_close_codes.py``.
"""

from __future__ import annotations

from tests.support.node import run_node

SENDING = r"""
// 1. resent with the same key until 202; in localStorage before the first POST
{
  const storage = newStorage();
  const log = [];
  const answers = [
    new TypeError("network down"),
    { status: 503, headers: { "Retry-After": "0" }, body: { code: "unavailable" } },
    { status: 429, body: { code: "outbox_full" } },
    { status: 408 },
    { status: 200, body: "html" }, // a 200 that names no entry proves nothing
    { status: 202, body: { id: "e1", text: "hi" } },
  ];
  let storedFirst = null;
  const post = scriptedFetch(answers, log);
  const fetch = async (url, init) => {
    storedFirst ??= pendingIn(storage)[0].text;
    return post(url, init);
  };
  const ob = createOutbox({ ...fast, storage, fetch, baseURL: "/outbox" });
  const result = await ob.send("w", "ses_1", "hi");
  results.retried = {
    result,
    posts: log.length,
    keys: new Set(log.map((x) => x.body.clientMessageID)).size,
    url: log[0].url,
    csrf: log[0].csrf,
    storedFirst,
    left: pendingIn(storage).length,
  };
  ob.close();
}
// 2. another 4xx is final: reported and dropped
{
  const storage = newStorage();
  const log = [];
  const events = [];
  const answers = [{ status: 413, body: { code: "too_large", detail: "big" } }];
  const ob = createOutbox({
    ...fast, storage, fetch: scriptedFetch(answers, log), onEvent: (e) => events.push(e.type),
  });
  let err = null;
  try {
    await ob.send("w", "ses_1", "x");
  } catch (e) {
    err = e;
  }
  results.final = {
    isOutboxError: err instanceof OutboxError,
    status: err.status,
    code: err.code,
    posts: log.length,
    left: pendingIn(storage).length,
    events: events.filter((t) => t !== "sending"),
  };
  ob.close();
}
// 3. one session's sends go oldest first; another session is not held up
{
  const log = [];
  const ok = (id) => ({ status: 202, body: { id } });
  const ob = make([new TypeError("x"), ok("o"), new TypeError("y"), ok("a"), ok("b")], log);
  await Promise.all([ob.send("w", "s1", "a"), ob.send("w", "s1", "b"), ob.send("w", "s2", "o")]);
  results.fifo = log.filter((x) => x.url.includes("/s1/")).map((x) => x.body.text);
  ob.close();
}
// 4. what a dead page of an earlier version left (one list) is resent with its own key
{
  const storage = newStorage();
  const log = [];
  const left = { workspace: "w", session: "s1", text: "left", clientMessageID: "cm-1",
    createdAt: 1, attempts: 3, nextAt: 0, sending: true };
  storage.setItem("k:pending", JSON.stringify([left]));
  const answers = [{ status: 200, body: { id: "e9", duplicate: true } }];
  const ob = createOutbox({ ...fast, storage, fetch: scriptedFetch(answers, log) });
  await until(() => log.length === 1 && pendingIn(storage).length === 0);
  results.resume = {
    posted: log.map((x) => x.body.clientMessageID),
    legacy: storage.getItem("k:pending"),
  };
  ob.close();
}
// 5. the WebSocket: versions, same-version batches, out-of-order updates, gaps, resync
{
  FakeWS.all = [];
  const views = [];
  const ob = make([], []);
  const sub = ob.subscribe("w", "ses_1", (v) => views.push(v));
  const ws = FakeWS.all[0];
  const e = (id, status, extra = {}) => ({
    id, status, text: id, clientMessageID: "c" + id,
    acceptedAt: `2026-01-01T00:00:0${id.slice(1)}Z`, ...extra,
  });
  const up = (version, state, entry) => ws.frame({ type: "queue.update", version, state, entry });
  const states = () => Object.fromEntries(views.at(-1).entries.map((r) => [r.id, r.state]));
  const backingOff = e("e2", "pending", { attempts: 1, nextAttemptAt: "2026-01-01T00:00:09Z" });
  ws.frame({ type: "queue.snapshot", version: 5, entries: [e("e1", "pending"), backingOff] });
  results.snap = states();
  up(6, "delivering", e("e1", "delivering"));
  results.blocked = views.at(-1).entries.find((r) => r.id === "e2").blockedByInFlight;
  up(6, "queued", e("e3", "pending")); // the same version: one mutation, several entries
  up(4, "error", e("e1", "error")); // stale
  up(8, "delivering", e("e2", "delivering")); // ahead of 7
  results.held = states();
  up(7, "sent", e("e1", "delivering")); // 7 arrives late: 7 then 8 apply
  results.filled = { states: states(), version: views.at(-1).version, resyncs: ws.sent.length };
  up(10, "sent", e("e2", "delivering")); // 9 never comes
  await until(() => ws.sent.length === 1);
  results.resync = ws.sent;
  ws.frame({ type: "queue.snapshot", version: 11, entries: [e("e3", "error")] });
  results.afterResync = { states: states(), version: views.at(-1).version };
  ws.drop(1006);
  await until(() => FakeWS.all.length === 2);
  results.reconnected = FakeWS.all[1].url;
  FakeWS.all[1].drop(4403);
  await sleep(20);
  const last = views.at(-1);
  results.forbidden = {
    sockets: FakeWS.all.length, error: last.error?.code, connected: last.connected,
  };
  sub.reconnect(); // the page may ask again (e.g. after a login)
  results.reopened = FakeWS.all.length;
  FakeWS.all[2].drop(4400);
  await sleep(20);
  results.invalid = { sockets: FakeWS.all.length, error: views.at(-1).error?.code };
  sub.close();
  ob.close();
}
// 6. retry and dismiss
{
  const log = [];
  const busy = { status: 409, body: { code: "busy", detail: "busy" } };
  const ob = make([{ status: 200, body: { id: "e1" } }, busy], log);
  const ok = await ob.retry("w", "ses_1", "e1");
  let err = null;
  try {
    await ob.dismiss("w", "ses_1", "e1");
  } catch (e) {
    err = e;
  }
  const calls = log.map((x) => [x.method, x.url, x.csrf]);
  results.ops = { ok, calls, err: [err.status, err.code] };
  ob.close();
}
console.log(JSON.stringify(results));
process.exit(0); // a hanging fetch's abort timer must not keep Node up
"""

AUTH = r"""
const refusal = (status, code, detail, headers = {}) =>
  ({ status, headers, body: { code, detail } });
const refusals = {
  expired: refusal(403, "not_authenticated", "Authentication credentials were not provided."),
  token: refusal(401, "authentication_failed", "Invalid token.", { "WWW-Authenticate": "Token" }),
  csrf: refusal(403, "permission_denied",
    "CSRF Failed: CSRF token from the 'X-Csrftoken' HTTP header incorrect."),
  bare401: { status: 401, body: "html" },
  // LoginRequiredMiddleware: a 302 to the login page, which fetch follows (200, HTML)
  redirect: { status: 200, redirected: true, body: "html" },
};
const ok = (id) => ({ status: 202, body: { id } });
// 1. a login refusal keeps the prompt, holds every send, and the same user's login resumes
for (const [name, refused] of Object.entries(refusals)) {
  const storage = newStorage();
  const log = [];
  const events = [];
  const answers = [refused, ok("e1"), ok("e2")];
  const ob = createOutbox({
    ...fast, storage, fetch: scriptedFetch(answers, log), onEvent: (e) => events.push(e.type),
  });
  const first = watch(ob.send("w", "s1", "kept"));
  await until(() => events.includes("held"));
  const second = watch(ob.send("w", "s2", "later")); // another session waits too
  await sleep(30); // many backoff periods: nothing is resent while logged out
  const heldView = {
    posts: log.length,
    stored: pendingIn(storage).map((x) => x.text),
    held: ob.pending().map((x) => x.held),
    hold: { reason: ob.hold().reason, code: ob.hold().code, status: ob.hold().status },
    settled: [first.state, second.state],
  };
  ob.loggedIn(); // the page saw the same user log in again
  await until(() => first.state !== "pending" && second.state !== "pending");
  results[name] = {
    heldView,
    after: { posts: log.length, settled: [first.value, second.value].map((v) => v.id),
      stored: pendingIn(storage).length, hold: ob.hold() },
  };
  ob.close();
}
// 2. a prompt resumed on page load whose login expired is kept, not silently dropped
{
  const storage = newStorage();
  const left = { workspace: "w", session: "s1", text: "from yesterday", clientMessageID: "cm-y",
    createdAt: 1, user: "u1" };
  storage.setItem("k:pending:cm-y", JSON.stringify(left));
  const log = [];
  const ob = createOutbox({ ...fast, storage, fetch: scriptedFetch([refusals.expired], log) });
  await until(() => ob.hold() !== null);
  await sleep(20);
  results.resumedExpired = { posts: log.length, stored: pendingIn(storage).map((x) => x.text) };
  ob.close();
}
// 3. the access policy refuses a session: kept, that session held, others go on; resume()
//    tries again once; a refusal with no JSON body is kept too
{
  const storage = newStorage();
  const log = [];
  const denied = refusal(403, "permission_denied",
    "The access policy does not allow this action here.");
  const answers = [denied, ok("o"), { status: 403, body: "html" }, ok("d")];
  const ob = createOutbox({ ...fast, storage, fetch: scriptedFetch(answers, log) });
  const views = [];
  const sub = ob.subscribe("w", "denied", (v) => views.push(v));
  const refused = watch(ob.send("w", "denied", "not here"));
  await until(() => ob.hold("w", "denied") !== null);
  const other = await ob.send("w", "open", "fine");
  await sleep(30);
  const first = { posts: log.length, other: other.id, settled: refused.state,
    hold: ob.hold("w", "denied").reason, loginHold: ob.hold(), viewHold: views.at(-1).hold?.reason,
    viewPending: views.at(-1).pending.map((p) => [p.text, p.held]) };
  ob.resume(); // one more try: refused again (no JSON this time), still kept
  await until(() => log.length === 3 && ob.hold("w", "denied") !== null);
  await sleep(30);
  const second = {
    posts: log.length,
    stored: pendingIn(storage).map((x) => x.text),
    code: ob.hold("w", "denied").code,
  };
  ob.resume();
  await until(() => refused.state !== "pending");
  results.forbidden = {
    first, second, settled: refused.value.id, stored: pendingIn(storage).length,
  };
  sub.close();
  ob.close();
}
// 4. cookie mode: the CSRF token is the one of the login the page was rendered for; a
//    login since (the cookie rotated) holds the prompts instead of using the new cookie
{
  globalThis.document = { cookie: "sessionid=x; csrftoken=T1" };
  const storage = newStorage();
  const log = [];
  const { csrfToken, ...cookieOpts } = fast;
  const answers = [new TypeError("offline"), { status: 202, body: { id: "e1" } }];
  const ob = createOutbox({ ...cookieOpts, storage, fetch: scriptedFetch(answers, log),
    backoff: { initial: 30, max: 30 } });
  const p = watch(ob.send("w", "s1", "mine"));
  await until(() => log.length === 1);
  globalThis.document.cookie = "csrftoken=T2"; // someone logged in in another tab
  await sleep(80);
  results.cookie = { posts: log.map((x) => x.csrf), hold: ob.hold()?.code, settled: p.state,
    stored: pendingIn(storage).length };
  ob.loggedIn("u1"); // the page knows it is its user again
  await until(() => p.state !== "pending");
  results.cookie.after = log.map((x) => x.csrf);
  ob.close();
  // The page passes the token it was rendered with: the cookie still tells a later login.
  globalThis.document.cookie = "csrftoken=T3";
  const log2 = [];
  const ob2 = createOutbox({ ...fast, csrfToken: "rendered", storage: newStorage(),
    fetch: scriptedFetch([new TypeError("offline")], log2), backoff: { initial: 30, max: 30 } });
  const p2 = watch(ob2.send("w", "s1", "mine"));
  await until(() => log2.length === 1);
  globalThis.document.cookie = "csrftoken=T4";
  await sleep(80);
  let refused = null;
  try { await ob2.dismiss("w", "s1", "e1"); } catch (e) { refused = e.code; }
  results.rendered = { posts: log2.map((x) => x.csrf), hold: ob2.hold()?.code,
    settled: p2.state, dismiss: refused };
  ob2.close();
  delete globalThis.document;
}
// 5. users on one browser: prompts are per user; a page rendered for another user holds
//    this user's open tab; a page of the same user lifts the hold
{
  const origin = new Origin();
  const t1 = origin.tab(), t2 = origin.tab(), t3 = origin.tab();
  const { storageKey, ...perUser } = fast;
  const log1 = [], log2 = [], log3 = [];
  const offline = () => new TypeError("offline");
  const a = createOutbox({ ...perUser, user: "alice", storage: t1.storage, window: t1.win,
    fetch: scriptedFetch([offline(), offline(), offline(), ok("a1")], log1),
    backoff: { initial: 20, max: 20 } });
  const p = watch(a.send("w", "s1", "alice's"));
  FakeWS.all = [];
  const aliceViews = [];
  a.subscribe("w", "s1", (v) => aliceViews.push(v));
  FakeWS.all[0].frame({ type: "queue.snapshot", version: 1, entries: [] });
  await until(() => log1.length === 1);
  const b = createOutbox({ ...perUser, user: "bob", storage: t2.storage, window: t2.win,
    fetch: scriptedFetch([{ status: 202, body: { id: "b1" } }], log2) });
  await sleep(60); // alice's tab would have retried twice by now
  t1.win.dispatchEvent(new Event("online"));
  await sleep(10);
  results.users = {
    keys: [...origin.m.keys()].filter((k) => k.includes(":pending:"))
      .map((k) => k.split(":pending:")[0]),
    alicePosts: log1.length, bobPosts: log2.length, bobSees: b.pending().length,
    hold: a.hold()?.code, settled: p.state,
    socket: { closed: FakeWS.all[0].readyState === 3, error: aliceViews.at(-1).error?.code,
      sockets: FakeWS.all.length },
  };
  const a2 = createOutbox({ ...perUser, user: "alice", storage: t3.storage, window: t3.win,
    fetch: scriptedFetch([{ status: 200, body: { id: "a1", duplicate: true } }], log3) });
  await until(() => p.state !== "pending");
  await until(() => pendingIn(t1.storage, "django-outbox:alice:pending:").length === 0);
  results.users.after = { settled: p.value.id, hold: a.hold(), bobPosts: log2.length,
    sockets: FakeWS.all.length };
  for (const ob of [a, b, a2]) ob.close();
  let thrown = null;
  try { createOutbox({ storage: newStorage() }); } catch (e) { thrown = e.name; }
  results.users.noUser = thrown;
}
// 6. two tabs of one user: each prompt has its own key, and every send() settles, with
//    the outcome whichever tab learned it (accepted, refused or cancelled)
{
  const origin = new Origin();
  const t1 = origin.tab(), t2 = origin.tab();
  const log1 = [], log2 = [];
  const one = createOutbox({ ...fast, storage: t1.storage, window: t1.win,
    fetch: scriptedFetch(["hang", "hang", "hang"], log1), requestTimeout: 60000 });
  const two = createOutbox({ ...fast, storage: t2.storage, window: t2.win,
    fetch: scriptedFetch([{ status: 202, body: { id: "e1", text: "x" } },
      { status: 413, body: { code: "too_large", detail: "big" } }], log2) });
  const sent = watch(one.send("w", "s1", "x")); // tab one's POST hangs; tab two's answers
  const big = watch(one.send("w", "s2", "y".repeat(10)));
  await until(() => sent.state !== "pending" && big.state !== "pending");
  const cancelled = watch(one.send("w", "s3", "z")); // tab two cancels it
  await until(() => two.pending("w", "s3").length === 1);
  two.cancel(two.pending("w", "s3")[0].clientMessageID);
  await until(() => cancelled.state !== "pending");
  // A prompt that vanished without a storage event (a page back from the back/forward
  // cache misses them): the tab asks the server again, with the same ID.
  const log3 = [];
  const three = createOutbox({ ...fast, storage: t2.storage, window: new EventTarget(),
    fetch: scriptedFetch([new TypeError("offline"), { status: 200, body: { id: "e9" } }], log3),
    backoff: { initial: 50, max: 50 } });
  const lost = watch(three.send("w", "s4", "q"));
  await until(() => log3.length === 1);
  for (const k of [...origin.m.keys()]) if (k.includes(":pending:")) origin.m.delete(k);
  await until(() => lost.state !== "pending");
  results.tabs = { sent: sent.value, big: big.value, cancelled: cancelled.value,
    lost: [lost.value, log3.length],
    stored: [...origin.m.keys()].filter((k) => k.includes(":pending")) };
  three.close();
  one.close();
  two.close();
}
console.log(JSON.stringify(results));
process.exit(0); // a hanging fetch's abort timer must not keep Node up
"""


def test_outbox_js_sends_orders_resumes_and_follows_the_queue(tmp_path):
    r = run_node(tmp_path, SENDING)
    # Network error, 503, 429, 408 and a 200 without an entry are resent with the same
    # key until the 202.
    assert r["retried"]["result"] == {
        "status": "accepted",
        "id": "e1",
        "entry": {"id": "e1", "text": "hi"},
    }
    assert r["retried"]["posts"] == 6 and r["retried"]["keys"] == 1
    assert r["retried"]["url"] == "/outbox/api/workspaces/w/sessions/ses_1/messages/"
    assert r["retried"]["csrf"] == "tok"
    assert r["retried"]["storedFirst"] == "hi"  # in localStorage before the first POST
    assert r["retried"]["left"] == 0
    # Another 4xx is final: reported, dropped, never resent.
    assert r["final"] == {
        "isOutboxError": True,
        "status": 413,
        "code": "too_large",
        "posts": 1,
        "left": 0,
        "events": ["queued", "rejected"],
    }
    # One session's sends go oldest first: b waits until a is acknowledged.
    assert r["fifo"] == ["a", "a", "a", "b"]
    # What a dead page of an earlier version left (one list) is resent with its own key.
    assert r["resume"] == {"posted": ["cm-1"], "legacy": None}
    # Snapshot, then updates by version; same-version batches apply, stale ones do not.
    assert r["snap"] == {"e1": "queued", "e2": "pending"}
    assert r["blocked"] is True
    assert r["held"] == {"e1": "delivering", "e2": "pending", "e3": "queued"}
    # An update ahead of a missing version waits for it; no resync when it turns up.
    assert r["filled"] == {
        "states": {"e1": "sent", "e2": "delivering", "e3": "queued"},
        "version": 8,
        "resyncs": 0,
    }
    # A version that never arrives: one resync, and the fresh snapshot wins.
    assert r["resync"] == [{"type": "resync"}]
    assert r["afterResync"] == {
        "states": {"e1": "sent", "e2": "finished", "e3": "error"},
        "version": 11,
    }
    # Reconnects after a dropped socket, not after 4403 or 4400 (until asked to).
    assert r["reconnected"] == "ws://example.test/ws/outbox/workspaces/w/sessions/ses_1/"
    assert r["forbidden"] == {"sockets": 2, "error": "forbidden", "connected": False}
    assert r["reopened"] == 3
    assert r["invalid"] == {"sockets": 3, "error": "invalid"}
    assert r["ops"]["calls"] == [
        ["POST", "/outbox/api/workspaces/w/sessions/ses_1/messages/e1/retry/", "tok"],
        ["DELETE", "/outbox/api/workspaces/w/sessions/ses_1/messages/e1/", "tok"],
    ]
    assert r["ops"]["err"] == [409, "busy"]


def test_outbox_js_keeps_prompts_through_logins_users_and_tabs(tmp_path):
    r = run_node(tmp_path, AUTH)
    # A login refusal (403 not_authenticated, 401, a CSRF failure, a bare 401, a redirect
    # to the login page) keeps the prompt, holds every session, resends nothing, leaves
    # send() unsettled; the same user's login sends both.
    codes = {
        "expired": (403, "not_authenticated"),
        "token": (401, "not_authenticated"),
        "csrf": (403, "csrf_failed"),
        "bare401": (401, "not_authenticated"),
        "redirect": (200, "not_authenticated"),
    }
    for name, (status, code) in codes.items():
        assert r[name]["heldView"] == {
            "posts": 1,
            "stored": ["kept", "later"],
            "held": ["login", "login"],
            "hold": {"reason": "login", "code": code, "status": status},
            "settled": ["pending", "pending"],
        }, name
        assert r[name]["after"] == {
            "posts": 3,
            "settled": ["e1", "e2"],
            "stored": 0,
            "hold": None,
        }, name
    # Resumed on page load with an expired login: kept (it used to vanish silently).
    assert r["resumedExpired"] == {"posts": 1, "stored": ["from yesterday"]}
    # The access policy's refusal holds that session only, keeps the prompt and its
    # send() open; resume() tries once more (a refusal without JSON is kept too).
    f = r["forbidden"]
    assert f["first"] == {
        "posts": 2,
        "other": "o",
        "settled": "pending",
        "hold": "forbidden",
        "loginHold": None,
        "viewHold": "forbidden",
        "viewPending": [["not here", "forbidden"]],
    }
    assert f["second"] == {"posts": 3, "stored": ["not here"], "code": "forbidden"}
    assert f["settled"] == "d" and f["stored"] == 0
    # Cookie mode: the token the page started with; after another login, nothing is sent
    # (no POST with the new cookie) until the page says its user is logged in again.
    assert r["cookie"] == {
        "posts": ["T1"],
        "hold": "login_changed",
        "settled": "pending",
        "stored": 1,
        "after": ["T1", "T2"],
    }
    assert r["rendered"] == {
        "posts": ["rendered"],
        "hold": "login_changed",
        "settled": "pending",
        "dismiss": "login_changed",
    }
    # Per-user keys; bob's page neither sends nor lists alice's prompt; alice's open tab
    # holds it once bob's page loads, and sends it when a page of alice's loads.
    u = r["users"]
    assert u["keys"] == ["django-outbox:alice"]
    assert u["alicePosts"] == 1 and u["bobPosts"] == 0 and u["bobSees"] == 0
    assert u["hold"] == "other_user" and u["settled"] == "pending"
    # ... and stops watching the queue as alice (a reconnect would carry bob's cookie).
    assert u["socket"] == {"closed": True, "error": "other_user", "sockets": 1}
    assert u["after"] == {"settled": "a1", "hold": None, "bobPosts": 0, "sockets": 2}
    assert u["noUser"] == "TypeError"
    # Two tabs: whichever tab learns a prompt's fate, the sending tab's promise settles.
    t = r["tabs"]
    assert t["sent"] == {"status": "accepted", "id": "e1", "entry": {"id": "e1", "text": "x"}}
    assert t["big"] == {"status": 413, "code": "too_large", "name": "OutboxError"}
    assert t["cancelled"] == {"status": 0, "code": "cancelled", "name": "OutboxError"}
    assert t["lost"] == [{"status": "duplicate", "id": "e9", "entry": None}, 2]
    assert t["stored"] == []
