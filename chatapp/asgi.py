import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatapp.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from chatapp.body_timeout import BodyTimeoutMiddleware  # noqa: E402
from chatapp.daphne_bodies import leave_bodies_to_the_app, time_out_slow_bodies  # noqa: E402
from chatapp.startup import start_process  # noqa: E402
from chatapp.web.routing import websocket_urlpatterns  # noqa: E402

# `make run` is the whole product: static files come from the app itself, no proxy needed.
http_app = ASGIStaticFilesHandler(django_asgi_app) if settings.SERVE_STATIC else django_asgi_app
# A body that never finishes arriving is a 408, not a request held open for ever: under
# servers that stream bodies to the app here, under daphne (which buffers them) there.
http_app = BodyTimeoutMiddleware(http_app, settings.REQUEST_BODY_TIMEOUT_S)
time_out_slow_bodies(settings.REQUEST_BODY_TIMEOUT_S)
# A malformed form upload reaches the app (a 415 with an error body), not a bare 400.
leave_bodies_to_the_app()

start_process(preload=settings.LLM_PRELOAD)

application = ProtocolTypeRouter({
    "http": http_app,
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
