"""What scheduling announces, for whoever acts on it (connected in the apps' ``ready``): lower
modules ask for work this way instead of importing the Celery tasks that do it."""

from __future__ import annotations

from django.dispatch import Signal

# a scheduling cycle should run: kwargs at_once (even if one is queued) and countdown (seconds)
cycle_wanted = Signal()
# an inference service was created or changed: its replicas should follow its profile now
services_changed = Signal()
# a cycle asks which pods' fabric links are congested now (kwarg snapshot): a receiver answers a
# bool array over the snapshot's pods, or None when it does not know
congestion_asked = Signal()
# a cycle asks which datacenters the control plane cannot reach now (kwarg snapshot): a receiver
# answers a bool array over the snapshot's datacenters, or None when none is partitioned
partitions_asked = Signal()
