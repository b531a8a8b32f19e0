"""ASGI applications served by real servers (uvicorn, daphne) or named in settings by the
tests; each module says which test serves it."""
