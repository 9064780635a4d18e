import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from chatapp.chat.routing import websocket_urlpatterns  # noqa: E402

http_app = django_asgi_app
if settings.SERVE_STATIC:
    # `make run` is the whole product: static files come from the app itself, no proxy needed.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    http_app = ASGIStaticFilesHandler(django_asgi_app)

if settings.LLM_PRELOAD:
    from chatapp.generation.engine import preload_in_background

    preload_in_background()

# History samples for the cache dashboard (a no-op until the engine is loaded; never raises
# into chat). DASHBOARD_SAMPLE_INTERVAL_S=0 turns it off, e.g. where Celery beat samples.
from chatapp.dashboard.sampling import start_sampler  # noqa: E402

start_sampler()

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
