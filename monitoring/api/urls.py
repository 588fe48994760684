"""Monitoring's API endpoints (config.api gathers every app's into one router and root)."""

from django.urls import path

from monitoring.api import agent, views
from monitoring.api.links import LinkViewSet, PartitionViewSet

routes = [
    ("links", LinkViewSet),
    ("partitions", PartitionViewSet),
    ("faults", views.FaultEventViewSet),
    ("congestion", views.CongestionRecordViewSet),
    ("simulations", views.SimulationViewSet),
]
urlpatterns = [
    path("overview/", views.OverviewView.as_view(), name="overview"),
    path("overview/history/", views.OverviewHistoryView.as_view(), name="overview-history"),
    path("telemetry/layout/", views.TelemetryLayoutView.as_view(), name="telemetry-layout"),
    path("telemetry/network/", views.NetworkView.as_view(), name="telemetry-network"),
    path("telemetry/fabric/", views.FabricView.as_view(), name="telemetry-fabric"),
    path("telemetry/frame/", views.TelemetryFrameView.as_view(), name="telemetry-frame"),
    path("telemetry/levels/", views.TelemetryLevelsView.as_view(), name="telemetry-levels"),
    path("telemetry/levels/find/", views.TelemetryLevelsFindView.as_view(), name="telemetry-levels-find"),
    path("nodes/<int:pk>/ports/", views.NodePortsView.as_view(), name="node-ports"),
    path("nodes/<int:pk>/ports/record/", views.NodePortsRecordView.as_view(), name="node-ports-record"),
    path("nodes/<int:pk>/ports/trace/", views.NodePortsTraceView.as_view(), name="node-ports-trace"),
    path("efficiency/", views.EfficiencyView.as_view(), name="efficiency"),
    path("drain-preview/", views.DrainPreviewView.as_view(), name="drain-preview"),
    path("agent/enrol/", agent.EnrolView.as_view(), name="agent-enrol"),
    path("agent/report/", agent.ReportView.as_view(), name="agent-report"),
    path("agent/assignments/", agent.AssignmentsView.as_view(), name="agent-assignments"),
    path("agent/trace/", agent.TraceView.as_view(), name="agent-trace"),
]
