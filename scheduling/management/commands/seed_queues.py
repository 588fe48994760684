from __future__ import annotations

from django.core.management.base import BaseCommand
from django.db import transaction

from cluster.models import Node
from scheduling.models import Cohort, Queue, QueueQuota


class Command(BaseCommand):
    help = (
        "Create example queues over the current cluster when none exist: cohort 'shared' with queues "
        "'pretrain' (half of every chip type, reclaims lent quota), 'finetune' (a quarter) and "
        "'research' (a quarter), plus 'inference' outside the cohort with no quota until an operator "
        "gives it some."
    )

    @transaction.atomic
    def handle(self, *args, **options):
        if Queue.objects.exists():
            self.stdout.write("Queues already exist; leaving them as they are.")
            return
        capacity: dict = {}
        for node in Node.objects.select_related("chip_type").only("gpus_per_node", "chip_type"):
            capacity[node.chip_type] = capacity.get(node.chip_type, 0) + node.gpus_per_node
        shared = Cohort.objects.create(name="shared", description="Training queues that lend idle quota")
        plans = [
            ("pretrain", 0.5, 10, "any"),
            ("finetune", 0.25, 5, "lower_priority"),
            ("research", 0.25, 0, "never"),
        ]
        for name, share, priority, reclaim in plans:
            queue = Queue.objects.create(
                name=name,
                cohort=shared,
                priority=priority,
                reclaim_within_cohort=reclaim,
                within_queue="lower_priority",
            )
            QueueQuota.objects.bulk_create(
                QueueQuota(queue=queue, chip_type=chip, nominal=int(total * share))
                for chip, total in capacity.items()
            )
        Queue.objects.create(name="inference", priority=20)
        self.stdout.write(
            f"Created cohort 'shared' with {len(plans)} queues over {sum(capacity.values())} GPUs, "
            "and queue 'inference'."
        )
