# What the active allocations add up to, kept by the database on PostgreSQL
# (scheduling.models.AllocationTotals): one statement-level trigger per event adds a row of what
# the statement changed (inserted active rows count +1, released or deleted ones -1; an UPDATE
# sees both sides), so the cycle's "did anyone else change an allocation?" reads a few rows instead
# of aggregating every allocation (a scan of the whole table, history included, while its
# statistics are stale: 10-30 ms a cycle). A TRUNCATE of the allocations empties the totals too.
# The mix is a hash of each (job, GPU) pair, so that two different sets of pairs with the same
# count and sums still differ. SQLite computes the same figures when asked (scheduling.store).

from django.db import migrations, models

MIX = "((job_id * 2654435761 + gpu_id * 40503) % 1000000007)"  # scheduling.store.MIX

_PG = f"""
CREATE OR REPLACE FUNCTION allocation_totals_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM scheduling_allocationtotals;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO scheduling_allocationtotals (count, job_sum, gpu_sum, mix_sum)
        SELECT COUNT(*), SUM(job_id), SUM(gpu_id), SUM({MIX}) FROM written WHERE active
        HAVING COUNT(*) > 0;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO scheduling_allocationtotals (count, job_sum, gpu_sum, mix_sum)
        SELECT -COUNT(*), -SUM(job_id), -SUM(gpu_id), -SUM({MIX}) FROM gone WHERE active
        HAVING COUNT(*) > 0;
    ELSE
        INSERT INTO scheduling_allocationtotals (count, job_sum, gpu_sum, mix_sum)
        SELECT SUM(sign), SUM(sign * job_id), SUM(sign * gpu_id), SUM(sign * {MIX}) FROM (
            SELECT 1 AS sign, job_id, gpu_id FROM written WHERE active
            UNION ALL
            SELECT -1, job_id, gpu_id FROM gone WHERE active
        ) AS changed
        HAVING SUM(sign) <> 0 OR SUM(sign * job_id) <> 0 OR SUM(sign * gpu_id) <> 0
            OR SUM(sign * {MIX}) <> 0;
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER allocation_totals_insert AFTER INSERT ON scheduling_allocation
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION allocation_totals_changed();
CREATE TRIGGER allocation_totals_update AFTER UPDATE ON scheduling_allocation
    REFERENCING OLD TABLE AS gone NEW TABLE AS written FOR EACH STATEMENT
    EXECUTE FUNCTION allocation_totals_changed();
CREATE TRIGGER allocation_totals_delete AFTER DELETE ON scheduling_allocation
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION allocation_totals_changed();
CREATE TRIGGER allocation_totals_truncate AFTER TRUNCATE ON scheduling_allocation
    FOR EACH STATEMENT EXECUTE FUNCTION allocation_totals_changed();
INSERT INTO scheduling_allocationtotals (count, job_sum, gpu_sum, mix_sum)
    SELECT COUNT(*), COALESCE(SUM(job_id), 0), COALESCE(SUM(gpu_id), 0), COALESCE(SUM({MIX}), 0)
    FROM scheduling_allocation WHERE active;
"""

_PG_DROP = """
DROP TRIGGER IF EXISTS allocation_totals_insert ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_update ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_delete ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_truncate ON scheduling_allocation;
DROP FUNCTION IF EXISTS allocation_totals_changed();
"""


def _run(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)  # no placeholders: % is the modulo

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0027_allocation_reference_probes"),
    ]

    operations = [
        migrations.CreateModel(
            name="AllocationTotals",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("count", models.BigIntegerField()),
                ("job_sum", models.BigIntegerField()),
                ("gpu_sum", models.BigIntegerField()),
                ("mix_sum", models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(_run(_PG), _run(_PG_DROP)),
    ]
