from django.urls import path
from rest_framework.routers import DefaultRouter

from monitoring.api import views

router = DefaultRouter()
router.register("faults", views.FaultEventViewSet)
router.register("simulations", views.SimulationViewSet)

urlpatterns = [
    path("overview/", views.OverviewView.as_view(), name="overview"),
    path("overview/history/", views.OverviewHistoryView.as_view(), name="overview-history"),
    path("telemetry/layout/", views.TelemetryLayoutView.as_view(), name="telemetry-layout"),
    path("telemetry/network/", views.NetworkView.as_view(), name="telemetry-network"),
    path("telemetry/frame/", views.TelemetryFrameView.as_view(), name="telemetry-frame"),
    *router.urls,
]
