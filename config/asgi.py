"""ASGI entry point: HTTP through Django (the node agents' reports and machine clients' API calls on
shorter paths), websockets through Channels (used by the live dashboard)."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from config.machine_api import MachineApi  # noqa: E402
from config.routing import websocket_urlpatterns  # noqa: E402
from monitoring.telemetry.agent_asgi import AgentReports  # noqa: E402

# Everything loaded so far lives as long as the process: keep it out of the cyclic collector's
# passes, which otherwise walk it again and again and stall requests (the agents' reports).
gc.freeze()

application = ProtocolTypeRouter(
    {
        # the node agents' reports skip Django's request cycle; machine clients' API calls skip the
        # browser's middleware and the per-request threads
        "http": AgentReports(MachineApi(django_asgi_app)),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
