"""One API under /api/v1/: every app's viewsets on one router, and one root that lists every
endpoint (the viewsets' lists and the apps' other views)."""

from __future__ import annotations

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

urlpatterns = [*(p for app in APPS for p in app.urlpatterns), *router.urls]
