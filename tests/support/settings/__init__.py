"""Django settings modules: ``base`` for the suite (pyproject.toml), the others for the
processes the tests start (workers, ASGI servers), each over ``base``."""
