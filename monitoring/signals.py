"""What monitoring announces, for whoever acts on it (connected in MonitoringConfig.ready): the
fault and what-if code asks for work this way instead of importing the Celery tasks that do it."""

from __future__ import annotations

from django.dispatch import Signal

# a fault was recorded and committed: kwargs fault (its id); it should be handled now
fault_recorded = Signal()
# what-if parts should run on the simulations workers: kwargs simulation (id), indices (list)
simulation_parts_wanted = Signal()
