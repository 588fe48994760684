"""Scheduling's API endpoints (config.api gathers every app's into one router and root)."""

from django.urls import path

from scheduling.api import array_views, views

routes = [
    ("checkpoint-policies", views.CheckpointPolicyViewSet),
    ("cohorts", views.CohortViewSet),
    ("queues", views.QueueViewSet),
    ("jobs", views.JobViewSet),
    ("arrays", array_views.JobArrayViewSet),
    ("services", views.InferenceServiceViewSet),
]
urlpatterns = [
    path("ettr/", views.ETTRView.as_view(), name="ettr"),
    path("usage/", views.UsageView.as_view(), name="usage"),
    path("usage/csv/", views.UsageCsvView.as_view(), name="usage-csv"),
    path("queue-history/", views.QueueHistoryView.as_view(), name="queue-history"),
]
