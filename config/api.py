"""One API under /api/v1/: every app's viewsets on one router, and one root that lists every
endpoint (the viewsets' lists and the apps' other views)."""

from __future__ import annotations

from django.http import JsonResponse
from django.urls import Resolver404, re_path, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework.routers import DefaultRouter

from cluster.api import urls as cluster_api
from monitoring.api import urls as monitoring_api
from scheduling.api import urls as scheduling_api

APPS = (cluster_api, scheduling_api, monitoring_api)


class Router(DefaultRouter):
    def get_api_root_view(self, api_urls=None):
        root = {
            prefix: self.routes[0].name.format(basename=basename) for prefix, _, basename in self.registry
        }
        for app in APPS:
            for pattern in app.urlpatterns:
                root[pattern.name] = pattern.name
        return self.APIRootView.as_view(api_root_dict=root)


router = Router()
for app in APPS:
    for prefix, viewset in app.routes:
        router.register(prefix, viewset)


@csrf_exempt  # it changes nothing: a write to no endpoint is a 404, not a CSRF failure
def not_found(request, rest: str = ""):
    """Anything under /api/v1/ that names no endpoint (or an id that is not one): a JSON 404, in
    debug mode too, so clients always read the same shape."""
    body = {"detail": f"no endpoint at {request.path}"}
    if not request.path.endswith("/"):
        try:
            if resolve(request.path + "/").url_name != "api-not-found":
                body["detail"] += f"; did you mean {request.path}/ ?"
        except Resolver404:
            pass
    return JsonResponse(body, status=404)


urlpatterns = [
    *(p for app in APPS for p in app.urlpatterns),
    *router.urls,
    re_path(r"^(?P<rest>.*)$", not_found, name="api-not-found"),  # last: only what nothing else took
]
