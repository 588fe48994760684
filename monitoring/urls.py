from django.urls import path

from monitoring import views
from monitoring.faults import pages as fault_pages
from monitoring.telemetry import metrics_views
from monitoring.telemetry import pages as telemetry_pages
from monitoring.whatif import pages as whatif_pages

urlpatterns = [
    path("metrics", metrics_views.control_plane, name="metrics"),
    path("metrics/gpus", metrics_views.gpus, name="metrics-gpus"),
    path("live/", views.live, name="live"),
    path("live/levels/", views.live_levels, name="live-levels"),
    path("overview/", views.overview_page, name="overview"),
    path("topology/", views.topology, name="topology"),
    path("topology/<str:level>/<int:pk>/", views.topology, name="topology-level"),
    path("nodes/<str:hostname>/", views.node_detail, name="node-page"),
    path("gpus/<int:pk>/", views.gpu_redirect, name="gpu-page"),
    path("faults/", fault_pages.faults, name="faults"),
    path("efficiency/", telemetry_pages.efficiency_page, name="efficiency"),
    path("simulations/", whatif_pages.simulations, name="simulations"),
    path("simulations/<int:pk>/", whatif_pages.simulation_detail, name="simulation-page"),
]
