"""A tiny ASGI app (no Django) for the browser test of outbox.js's close codes.

Served by uvicorn in ``tests/browser/test_browser_close_codes.py``. ``GET /?session=<name>``
is a page that subscribes outbox.js to ``ws1``/``<name>`` and keeps every view in
``window.views`` (or, for a name outbox.js refuses as an ID, its error in
``window.refused``); ``GET /outbox.js`` is the client; ``GET /connects`` counts the
socket connections per session. The queue socket of each session behaves as named:

- ``refused``: accepted, then closed with 4403 (what the README promises for a refusal);
- ``invalid``: accepted, then closed with 4400 (an invalid ID);
- ``handshake``: refused before accepting (the browser sees HTTP 403, close code 1006);
- ``live``: accepted, sends an empty snapshot, stays open;
- ``behind``: the first connection sends a snapshot and a ``queue.current`` that carry
  acknowledgement tokens, waits for the client to echo both, then closes with 4408 (a
  socket that stayed behind); later ones send a snapshot and stay open. ``GET /received``
  lists the frames each session's sockets received.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tests.support.paths import OUTBOX_JS

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>outbox.js close codes</title></head>
<body>
<script type="module">
  import { createOutbox } from "/outbox.js";
  const session = new URLSearchParams(location.search).get("session");
  window.views = [];
  const outbox = createOutbox({ user: "tester", reconnect: { initial: 100, max: 200 } });
  try {
    window.subscription = outbox.subscribe("ws1", session, (view) => window.views.push(view));
  } catch (error) {  // an ID the server's rule refuses: no socket is opened
    window.refused = { name: error.name, code: error.code, status: error.status };
  }
</script>
</body></html>
"""

CLOSE_AFTER_ACCEPT = {"refused": 4403, "invalid": 4400}
connects: Counter[str] = Counter()
received: dict[str, list[Any]] = {}


async def _http(scope: dict[str, Any], send: Any) -> None:
    path = scope["path"]
    if path == "/":
        body, kind = PAGE.encode(), b"text/html; charset=utf-8"
    elif path == "/outbox.js":
        body, kind = OUTBOX_JS.read_bytes(), b"text/javascript; charset=utf-8"
    elif path == "/connects":
        body, kind = json.dumps(connects).encode(), b"application/json"
    elif path == "/received":
        body, kind = json.dumps(received).encode(), b"application/json"
    else:
        body, kind = b"not found", b"text/plain"
    status = 404 if body == b"not found" else 200
    headers = [(b"content-type", kind), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _websocket(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    session = scope["path"].rstrip("/").rsplit("/", 1)[-1]
    connects[session] += 1
    if session == "handshake":
        await send({"type": "websocket.close", "code": 4403})  # before accept: HTTP 403
        return
    await send({"type": "websocket.accept"})
    if session in CLOSE_AFTER_ACCEPT:
        await send({"type": "websocket.close", "code": CLOSE_AFTER_ACCEPT[session]})
        return
    if session == "behind":
        await _behind(session, receive, send)
        return
    snapshot = {"type": "queue.snapshot", "version": 1, "entries": []}
    await send({"type": "websocket.send", "text": json.dumps(snapshot)})
    while (await receive())["type"] != "websocket.disconnect":
        pass


async def _behind(session: str, receive: Any, send: Any) -> None:
    frames = received.setdefault(session, [])

    async def answer() -> bool:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return False
        frames.append(json.loads(message.get("text") or "null"))
        return True

    version = connects[session]
    snapshot = {"type": "queue.snapshot", "version": version, "page": 1, "pages": 1}
    await send(
        {
            "type": "websocket.send",
            "text": json.dumps({**snapshot, "entries": [], "ack": f"s{version}"}),
        }
    )
    if version > 1:
        while await answer():
            pass
        return
    if not await answer():
        return
    current = {"type": "queue.current", "version": version, "ack": "c1"}
    await send({"type": "websocket.send", "text": json.dumps(current)})
    if await answer():
        await send({"type": "websocket.close", "code": 4408})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI entry point (http, websocket, lifespan)."""
    if scope["type"] == "http":
        await _http(scope, send)
    elif scope["type"] == "websocket":
        await _websocket(scope, receive, send)
    elif scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
