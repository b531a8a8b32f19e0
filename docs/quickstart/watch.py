"""watch.py: print one session's queue as the outbox's WebSocket sends it.

    python watch.py WORKSPACE SESSION [--until sent]

Logs in through the admin's login form, as a browser would (a session cookie), then
opens ws/outbox/workspaces/<ws>/sessions/<ses>/ with that cookie and this site's
Origin, and prints every frame: a queue.snapshot first, then each queue.update.
"""

import argparse
import asyncio
import json
import os

import httpx
from websockets.asyncio.client import connect


def login(server: str, username: str, password: str) -> str:
    """The session cookie of a login through /admin/login/ (staff accounts)."""
    # The login hashes the password: a busy server may take longer than httpx's 5 s.
    with httpx.Client(base_url=server, timeout=30) as http:
        http.get("/admin/login/")  # sets the csrftoken cookie
        http.post(
            "/admin/login/",
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": http.cookies["csrftoken"],
                "next": "/admin/",
            },
        )
        session = http.cookies.get("sessionid")
    if not session:
        raise SystemExit("login failed: check the user name and password")
    return session


async def watch(args: argparse.Namespace) -> None:
    session = login(args.server, args.user, args.password)
    url = args.server.replace("http", "ws", 1)
    url += f"/ws/outbox/workspaces/{args.workspace}/sessions/{args.session}/"
    headers = {"Cookie": f"sessionid={session}"}
    async with connect(url, origin=args.server, additional_headers=headers) as socket:
        async for frame in socket:
            message = json.loads(frame)
            print(json.dumps(message), flush=True)
            if message.get("type") == "queue.update" and message.get("state") == args.until:
                return


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace")
    parser.add_argument("session")
    parser.add_argument("--server", default="http://127.0.0.1:8000")
    parser.add_argument("--user", default=os.environ.get("OUTBOX_USER", "admin"))
    parser.add_argument("--password", default=os.environ.get("OUTBOX_PASSWORD", ""))
    parser.add_argument("--until", help="exit after an update with this state, e.g. sent")
    asyncio.run(watch(parser.parse_args()))
