"""A LangGraph graph that needs no model: it answers each user message with its echo.

Served by ``langgraph dev`` (the in-memory LangGraph Agent Server) from the
``.venv-langgraph`` environment (``make langgraph``) for tests/langgraph and
``make demo AGENT=langgraph`` (docs/howto/langgraph.md). It imports nothing of
django-outbox. A message whose text is ``hold <path>`` keeps its run going until
that file exists (or ten minutes pass), so a test decides when a turn ends and can
cut one that is still running; ``sleep <seconds>`` holds the run that long (the demo
uses it to look like an agent that thinks).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from langgraph.graph import END, START, MessagesState, StateGraph

HOLD_LIMIT = 600.0  # seconds a "hold" run waits at most for its file
POLL = 0.05  # seconds between two looks at the file


def _text(message: object) -> str:
    content = getattr(message, "content", "")
    return content if isinstance(content, str) else str(content)


async def respond(state: MessagesState) -> dict[str, list[dict[str, str]]]:
    text = _text(state["messages"][-1]) if state["messages"] else ""
    if text.startswith("hold "):
        path = Path(text[len("hold ") :].strip())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HOLD_LIMIT
        while not await asyncio.to_thread(path.exists) and loop.time() < deadline:
            await asyncio.sleep(POLL)
    elif text.startswith("sleep "):
        try:
            await asyncio.sleep(min(float(text.split()[1]), HOLD_LIMIT))
        except (IndexError, ValueError):
            pass
    return {"messages": [{"role": "assistant", "content": f"echo: {text}"}]}


builder = StateGraph(MessagesState)
builder.add_node("respond", respond)
builder.add_edge(START, "respond")
builder.add_edge("respond", END)
graph = builder.compile()
