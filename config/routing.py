"""Websocket routes of the live dashboard."""

from django.urls import path

from monitoring.consumers import TelemetryConsumer

websocket_urlpatterns: list = [path("ws/telemetry/", TelemetryConsumer.as_asgi())]
