"""ASGI applications for the origin-validator checks (django_outbox.W008 / W009 / W011)."""

from channels.auth import AuthMiddlewareStack
from channels.generic.websocket import WebsocketConsumer
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import AllowedHostsOriginValidator, OriginValidator
from django.core.asgi import get_asgi_application
from django.urls import path

from django_outbox.ws.routing import websocket_urlpatterns

http = get_asgi_application()


def routes():
    return URLRouter(websocket_urlpatterns)


def closure_middleware(inner):
    """A function middleware: what it wraps is hidden in a closure."""

    async def app(scope, receive, send):
        return await inner(scope, receive, send)

    return app


class AppMiddleware:
    """A class middleware that keeps what it wraps as ``app`` (Starlette's way)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        return await self.app(scope, receive, send)


class Echo(WebsocketConsumer):
    """Some other consumer."""


guarded = ProtocolTypeRouter(
    {"http": http, "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(routes()))}
)
explicit_origins = ProtocolTypeRouter(
    {"websocket": OriginValidator(AuthMiddlewareStack(routes()), ["https://example.com"])}
)
unguarded = ProtocolTypeRouter({"http": http, "websocket": AuthMiddlewareStack(routes())})
guard_inside_auth_only_for_one_route = ProtocolTypeRouter(
    {
        "websocket": AuthMiddlewareStack(
            URLRouter(
                [
                    path("v1/", AllowedHostsOriginValidator(routes())),
                    path("v2/", routes()),
                ]
            )
        )
    }
)
behind_app_middleware = ProtocolTypeRouter({"websocket": AppMiddleware(routes())})
hidden = ProtocolTypeRouter({"http": http, "websocket": closure_middleware(routes())})
hidden_but_guarded = ProtocolTypeRouter(
    {"websocket": AllowedHostsOriginValidator(closure_middleware(routes()))}
)
other_consumer_only = ProtocolTypeRouter({"websocket": URLRouter([path("echo/", Echo.as_asgi())])})
no_websocket = ProtocolTypeRouter({"http": http})
any_origin = ProtocolTypeRouter(
    {"websocket": OriginValidator(AuthMiddlewareStack(routes()), ["*"])}
)
open_around_strict = ProtocolTypeRouter(
    {"websocket": OriginValidator(AllowedHostsOriginValidator(routes()), ["*"])}
)
open_for_another_consumer_only = ProtocolTypeRouter(
    {
        "websocket": URLRouter(
            [
                path("echo/", OriginValidator(Echo.as_asgi(), ["*"])),
                path("", AllowedHostsOriginValidator(routes())),
            ]
        )
    }
)


def __getattr__(name):
    """``allowed_hosts_now``: the outbox routes behind django_outbox's
    ``AllowedHostsOriginValidator``, built when asked (it reads ``ALLOWED_HOSTS`` then, so
    a test's ``override_settings`` applies)."""
    if name == "allowed_hosts_now":
        from django_outbox.ws import AllowedHostsOriginValidator as Logging

        return ProtocolTypeRouter({"websocket": Logging(AuthMiddlewareStack(routes()))})
    raise AttributeError(name)
