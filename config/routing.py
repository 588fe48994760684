"""Websocket routes; the live dashboard's consumers register here."""

websocket_urlpatterns: list = []
