"""The ASGI application of the paged-snapshot browser test
(tests/browser/test_browser_snapshot_pages.py): ``GET /`` is a page that subscribes outbox.js to
``alice``/``s1`` and keeps every view in ``window.views`` and every snapshot page's
``{page, pages, bytes}`` in ``window.pages``; ``GET /outbox.js`` is the client; the queue
WebSocket is the real consumer behind ``AuthMiddlewareStack`` (settings:
``tests.support.settings.live``)."""

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

from tests.support.paths import OUTBOX_JS

get_asgi_application()  # sets Django up before the routes import models

from django_outbox.ws.routing import websocket_urlpatterns  # noqa: E402

PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>outbox.js snapshot pages</title></head>
<body>
<script type="module">
  import { createOutbox } from "/outbox.js";
  window.views = [];
  window.pages = [];
  class Counting extends WebSocket {
    constructor(url) {
      super(url);
      this.addEventListener("message", (event) => {
        const m = JSON.parse(event.data);
        if (m.type === "queue.snapshot") {
          window.pages.push({ page: m.page, pages: m.pages, bytes: event.data.length });
        }
      });
    }
  }
  const outbox = createOutbox({ user: "alice", WebSocket: Counting });
  window.subscription = outbox.subscribe("alice", "s1", (view) => window.views.push(view));
</script>
</body></html>
"""


async def http(scope, receive, send):
    """The page and the client; 404 for anything else."""
    if scope["path"] == "/":
        body, kind = PAGE, b"text/html; charset=utf-8"
    elif scope["path"] == "/outbox.js":
        body, kind = OUTBOX_JS.read_bytes(), b"text/javascript; charset=utf-8"
    else:
        body, kind = b"not found", b"text/plain"
    status = 404 if body == b"not found" else 200
    headers = [(b"content-type", kind), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


application = ProtocolTypeRouter(
    {"http": http, "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns))}
)
