"""The queue WebSocket: the consumer in process and behind uvicorn and daphne, its refusals, and
how an open socket stays true to the queue."""
