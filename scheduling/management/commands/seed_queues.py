from __future__ import annotations

from django.core.management.base import BaseCommand
from django.db import transaction

from cluster.models import Node
from scheduling.models import Cohort, InferenceService, Queue, QueueQuota


class Command(BaseCommand):
    help = (
        "Create example queues over the current cluster when none exist: cohort 'shared' with queues "
        "'inference' (a tenth of the most common chip type, priority 20, reclaims anything it lent), "
        "'pretrain' (half of every chip type, reclaims lent quota), 'finetune' (a quarter) and "
        "'research' (the rest), and inference service 'chat' whose diurnal load peaks at 14:00 UTC: "
        "training borrows the inference GPUs at night and gives them back at the peak."
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
        main_chip = max(capacity, key=capacity.get)
        inference_gpus = capacity[main_chip] // 10 // 8 * 8
        for name, share, priority, reclaim in plans:
            queue = Queue.objects.create(
                name=name,
                cohort=shared,
                priority=priority,
                reclaim_within_cohort=reclaim,
                within_queue="lower_priority",
            )
            QueueQuota.objects.bulk_create(
                QueueQuota(
                    queue=queue,
                    chip_type=chip,
                    nominal=int((total - (inference_gpus if chip == main_chip else 0)) * share),
                )
                for chip, total in capacity.items()
            )
        inference = Queue.objects.create(
            name="inference", cohort=shared, priority=20, reclaim_within_cohort="any", within_queue="never"
        )
        if inference_gpus:
            QueueQuota.objects.create(queue=inference, chip_type=main_chip, nominal=inference_gpus)
            replicas = inference_gpus // 8
            InferenceService.objects.create(
                name="chat",
                queue=inference,
                chip_types=[main_chip.name],
                replica_gpus=8,
                capacity_rps=40.0,
                headroom=0.2,
                min_replicas=1,
                max_replicas=replicas,
                load_profile={
                    "kind": "diurnal",
                    "trough_rps": round(0.1 * replicas * 40 / 1.2, 1),
                    "peak_rps": round(replicas * 40 / 1.2, 1),
                    "peak_hour": 14,
                    "burst": "azure-conv",
                },
            )
        self.stdout.write(
            f"Created cohort 'shared' with {len(plans) + 1} queues over {sum(capacity.values())} GPUs "
            f"({inference_gpus} {main_chip.name} for inference, service 'chat')."
        )
