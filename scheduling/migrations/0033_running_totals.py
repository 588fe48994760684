# What the running jobs add up to, kept by the database on PostgreSQL
# (scheduling.models.RunningTotals), as migration 0028 keeps the active allocations': one
# statement-level trigger per event adds a row of what the statement changed among running jobs
# (a row that became running, or a running row whose revision rose, counts on the new side; the
# row as it was, if it was running, on the old side). The revision trigger (migration 0026) runs
# before each row is written, so the new side has the raised revision. The mix is a hash of each
# (id, revision), so that two different sets with the same count and sums still differ.

from django.db import migrations, models

MIX = "((id * 2654435761 + revision * 40503) % 1000000007)"  # scheduling.running._figures

_PG = f"""
CREATE OR REPLACE FUNCTION running_totals_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM scheduling_runningtotals;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO scheduling_runningtotals (count, id_sum, revision_sum, mix_sum)
        SELECT COUNT(*), SUM(id), SUM(revision), SUM({MIX}) FROM written WHERE state = 'running'
        HAVING COUNT(*) > 0;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO scheduling_runningtotals (count, id_sum, revision_sum, mix_sum)
        SELECT -COUNT(*), -SUM(id), -SUM(revision), -SUM({MIX}) FROM gone WHERE state = 'running'
        HAVING COUNT(*) > 0;
    ELSE
        INSERT INTO scheduling_runningtotals (count, id_sum, revision_sum, mix_sum)
        SELECT SUM(sign), SUM(sign * id), SUM(sign * revision), SUM(sign * {MIX}) FROM (
            SELECT 1 AS sign, id, revision FROM written WHERE state = 'running'
            UNION ALL
            SELECT -1, id, revision FROM gone WHERE state = 'running'
        ) AS changed
        HAVING SUM(sign) <> 0 OR SUM(sign * id) <> 0 OR SUM(sign * revision) <> 0
            OR SUM(sign * {MIX}) <> 0;
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER running_totals_insert AFTER INSERT ON scheduling_job
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION running_totals_changed();
CREATE TRIGGER running_totals_update AFTER UPDATE ON scheduling_job
    REFERENCING OLD TABLE AS gone NEW TABLE AS written FOR EACH STATEMENT
    EXECUTE FUNCTION running_totals_changed();
CREATE TRIGGER running_totals_delete AFTER DELETE ON scheduling_job
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION running_totals_changed();
CREATE TRIGGER running_totals_truncate AFTER TRUNCATE ON scheduling_job
    FOR EACH STATEMENT EXECUTE FUNCTION running_totals_changed();
INSERT INTO scheduling_runningtotals (count, id_sum, revision_sum, mix_sum)
    SELECT COUNT(*), COALESCE(SUM(id), 0), COALESCE(SUM(revision), 0), COALESCE(SUM({MIX}), 0)
    FROM scheduling_job WHERE state = 'running';
"""

_PG_DROP = """
DROP TRIGGER IF EXISTS running_totals_insert ON scheduling_job;
DROP TRIGGER IF EXISTS running_totals_update ON scheduling_job;
DROP TRIGGER IF EXISTS running_totals_delete ON scheduling_job;
DROP TRIGGER IF EXISTS running_totals_truncate ON scheduling_job;
DROP FUNCTION IF EXISTS running_totals_changed();
"""


def _run(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)  # no placeholders: % is the modulo

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0032_job_fillfactor"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunningTotals",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("count", models.BigIntegerField()),
                ("id_sum", models.BigIntegerField()),
                ("revision_sum", models.BigIntegerField()),
                ("mix_sum", models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(_run(_PG), _run(_PG_DROP)),
    ]
