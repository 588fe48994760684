"""The inventory's API endpoints (config.api gathers every app's into one router and root)."""

from cluster.api import views

routes = [
    ("chip-types", views.ChipTypeViewSet),
    ("regions", views.RegionViewSet),
    ("datacenters", views.DatacenterViewSet),
    ("pods", views.PodViewSet),
    ("racks", views.RackViewSet),
    ("nodes", views.NodeViewSet),
    ("gpus", views.GPUViewSet),
    ("enrolment-tokens", views.EnrolmentTokenViewSet),
    ("node-credentials", views.NodeCredentialViewSet),
]
urlpatterns = []
