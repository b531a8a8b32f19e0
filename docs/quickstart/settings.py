# --- django-outbox: append this to mysite/settings.py ------------------------------------
import os

# Additive: in a project that lists DRF, Channels or WhiteNoise already, nothing is doubled.
INSTALLED_APPS += [
    app for app in ("rest_framework", "channels", "django_outbox") if app not in INSTALLED_APPS
]

# WhiteNoise serves outbox.js and the admin's CSS from the ASGI server itself: from the
# apps' folders while DEBUG is on, from STATIC_ROOT (collectstatic) in production.
if "whitenoise.middleware.WhiteNoiseMiddleware" not in MIDDLEWARE:
    MIDDLEWARE.insert(1, "whitenoise.middleware.WhiteNoiseMiddleware")  # after SecurityMiddleware
STATIC_ROOT = globals().get("STATIC_ROOT") or BASE_DIR / "staticfiles"

ASGI_APPLICATION = "mysite.asgi.application"

# One Valkey: the queue in database 0, the channel layer's live events in database 1.
VALKEY = os.environ.get("VALKEY", "redis://127.0.0.1:6379")

OUTBOX = {
    "VALKEY_URL": f"{VALKEY}/0",
    "DELIVERER": "mysite.agent.deliver",
    "VERIFIER": "mysite.agent.verify",
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # socket_timeout above channels-redis's 5 s blocking receive: with redis-py 8's
            # default an idle WebSocket is torn down every 5 s.
            "hosts": [{"address": f"{VALKEY}/1", "socket_timeout": 30}],
        },
    },
}
