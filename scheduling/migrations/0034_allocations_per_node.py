"""Allocations become one row per job, node and bank of eight GPUs (a mask of its GPUs) instead of
one row per GPU: a 100k-GPU fill writes ~12,000 rows instead of 90,000 (``bench.allocation_rows``:
2.7x faster to insert on PostgreSQL, 2.2x on SQLite, 7-8x faster to read and release). The rule
that no GPU is in two active whole allocations stays in the database: one partial unique index
per bit of the mask. Every row, active or released, is carried over: the GPUs of one job, node,
bank, state, share and times become one row. ``AllocatedGPU`` is a view that reads the new rows
one GPU at a time. Migration 0035 puts back the triggers (references, shared GPUs, totals).

On SQLite a view must not name a table that a later migration rebuilds (Django's SQLite schema
editor copies a table to change it, and SQLite then refuses the view): a later migration that
alters ``scheduling_allocation`` or ``cluster_gpu`` drops the view first and creates it again
after (``VIEW`` below).
"""

import django.db.models.deletion
import django.db.models.lookups
from django.db import migrations, models

_DROP_PG = """
DROP TRIGGER IF EXISTS allocation_totals_insert ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_update ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_delete ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_truncate ON scheduling_allocation;
DROP TRIGGER IF EXISTS shared_gpu_guard_insert ON scheduling_allocation;
DROP TRIGGER IF EXISTS shared_gpu_guard_update ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_references_insert ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_references_fixed ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_gpu_delete_lock ON cluster_gpu;
DROP TRIGGER IF EXISTS allocation_gpu_delete_guard ON cluster_gpu;
DROP TRIGGER IF EXISTS allocation_job_delete_lock ON scheduling_job;
DROP TRIGGER IF EXISTS allocation_job_delete_guard ON scheduling_job;
"""
_DROP_SQLITE = [
    f"DROP TRIGGER IF EXISTS shared_gpu_guard_{name}"
    for name in ("insert", "update", "insert_whole", "insert_shared", "update_whole", "update_shared")
]

# every row of the old table, grouped: one job's GPUs of one node and bank with the same state,
# share and times are one row (distinct GPUs of a bank are distinct powers of two, so SUM is OR)
_COPY = """
INSERT INTO scheduling_allocation (job_id, node_id, bank, slots, active, share, created_at, released_at)
SELECT a.job_id, g.node_id, g."index" / 8, SUM(DISTINCT 1 << (g."index" % 8)), a.active, a.share,
       a.created_at, a.released_at
FROM scheduling_gpuallocation a JOIN cluster_gpu g ON g.id = a.gpu_id
GROUP BY a.job_id, g.node_id, g."index" / 8, a.active, a.share, a.created_at, a.released_at
"""

VIEW = """
CREATE VIEW scheduling_allocatedgpu AS
SELECT a.id * 128 + g."index" AS id, a.id AS allocation_id, a.job_id, g.id AS gpu_id, a.node_id,
       g."index" AS "index", a.active, a.share, a.created_at, a.released_at
FROM scheduling_allocation a
JOIN cluster_gpu g ON g.node_id = a.node_id AND g."index" / 8 = a.bank AND (a.slots & (1 << (g."index" % 8))) <> 0
"""


def drop_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_DROP_PG)
    else:
        for sql in _DROP_SQLITE:
            schema_editor.execute(sql)


def copy_rows(apps, schema_editor):
    schema_editor.execute(_COPY, params=None)  # no placeholders: % is the modulo


def _bit(k):
    return models.Q(django.db.models.lookups.Exact(models.F("slots").bitand(1 << k), 1 << k))


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0010_inventory_revision"),
        ("scheduling", "0033_running_totals"),
    ]

    operations = [
        migrations.RunPython(drop_triggers, migrations.RunPython.noop),
        migrations.RenameModel("Allocation", "GPUAllocation"),
        migrations.AlterField(
            model_name="gpuallocation",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="scheduling.job",
            ),
        ),
        migrations.AlterField(
            model_name="gpuallocation",
            name="gpu",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="cluster.gpu",
            ),
        ),
        migrations.CreateModel(
            name="Allocation",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "bank",
                    models.PositiveSmallIntegerField(default=0, help_text="GPUs 8 x bank to 8 x bank + 7 of the node"),
                ),
                ("slots", models.PositiveSmallIntegerField(help_text="Bit k set: the node's GPU 8 x bank + k")),
                ("active", models.BooleanField(default=True)),
                ("share", models.PositiveSmallIntegerField(default=1000, help_text="Thousandths of each GPU")),
                ("created_at", models.DateTimeField()),
                ("released_at", models.DateTimeField(blank=True, null=True)),
                (
                    "job",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="allocations",
                        to="scheduling.job",
                    ),
                ),
                (
                    "node",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="allocations",
                        to="cluster.node",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("active", True)),
                        fields=["job", "node", "bank", "slots"],
                        include=["id"],
                        name="allocation_active_rows",
                    ),
                    models.Index(
                        condition=models.Q(("active", True)), fields=["node", "bank"], name="allocation_active_by_node"
                    ),
                    models.Index(
                        condition=models.Q(("active", True), ("share__lt", 1000)),
                        fields=["node", "bank"],
                        name="allocation_shared_rows",
                    ),
                ],
                "constraints": [
                    *(
                        models.UniqueConstraint(
                            condition=models.Q(("active", True), ("share", 1000)) & _bit(k),
                            fields=("node", "bank"),
                            name=f"gpu_slot{k}_in_one_active_allocation",
                        )
                        for k in range(8)
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("share__gte", 1), ("share__lte", 1000)), name="allocation_share_range"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("slots__gte", 1), ("slots__lte", 255)), name="allocation_slots_range"
                    ),
                    models.CheckConstraint(condition=models.Q(("bank__lte", 8)), name="allocation_bank_range"),
                    models.CheckConstraint(
                        condition=models.Q(("share", 1000), ("slots__in", [1, 2, 4, 8, 16, 32, 64, 128]), _connector="OR"),
                        name="allocation_shared_one_gpu",
                    ),
                ],
            },
        ),
        migrations.RunPython(copy_rows, migrations.RunPython.noop),
        migrations.DeleteModel("GPUAllocation"),
        migrations.CreateModel(
            name="AllocatedGPU",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("index", models.PositiveSmallIntegerField(verbose_name="index on node")),
                ("active", models.BooleanField()),
                ("share", models.PositiveSmallIntegerField()),
                ("created_at", models.DateTimeField()),
                ("released_at", models.DateTimeField(null=True)),
                (
                    "allocation",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="gpus",
                        to="scheduling.allocation",
                    ),
                ),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="gpus_held",
                        to="scheduling.job",
                    ),
                ),
                (
                    "gpu",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="allocations",
                        to="cluster.gpu",
                    ),
                ),
                (
                    "node",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="cluster.node",
                    ),
                ),
            ],
            options={"verbose_name": "allocated GPU", "db_table": "scheduling_allocatedgpu", "managed": False},
        ),
        migrations.RunSQL(VIEW, "DROP VIEW IF EXISTS scheduling_allocatedgpu"),
    ]
