"""Websocket routes of the live dashboard."""

from django.urls import path

from monitoring.telemetry.consumers import LevelsConsumer, TelemetryConsumer

websocket_urlpatterns: list = [
    path("ws/telemetry/", TelemetryConsumer.as_asgi()),
    path("ws/levels/", LevelsConsumer.as_asgi()),
]
