"""Telemetry: agents' reports (reports) and their ingest, the live store, the fleet a level at a
time (levels) and over websockets (consumers), the overview, and Prometheus metrics."""
