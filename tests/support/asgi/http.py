"""The test project's HTTP application for a real ASGI server."""

from django.core.asgi import get_asgi_application

application = get_asgi_application()
