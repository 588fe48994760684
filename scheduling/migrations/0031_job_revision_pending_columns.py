# Job.revision also rises when an UPDATE names a column the scheduler reads of a pending job
# (scheduling.pending keeps the pending jobs between cycles as scheduling.running keeps the running
# ones): the chip types and their ranking, the submit time, the model and the requeue time join
# the columns of migration 0026. The pending reason is not among them: the cycle writes it, and
# reads it afresh every cycle.

from django.db import migrations

RUNNING = (
    "state, queue_id, chip_id, priority, started_at, estimated_duration_s, last_checkpoint_at, "
    "min_gpus, gpus, size_step, topology, share, mixed_chips, array_id"
)
WATCHED = RUNNING + ", chip_types, chip_ranking, submitted_at, model, requeue_at"


def _statements(columns: str) -> dict:
    return {
        "postgresql": [
            "DROP TRIGGER IF EXISTS scheduling_job_revision ON scheduling_job",
            f"CREATE TRIGGER scheduling_job_revision BEFORE UPDATE OF {columns} ON scheduling_job "
            "FOR EACH ROW EXECUTE FUNCTION scheduling_job_revision()",
        ],
        "sqlite": [
            "DROP TRIGGER IF EXISTS scheduling_job_revision",
            f"CREATE TRIGGER scheduling_job_revision AFTER UPDATE OF {columns} ON scheduling_job "
            "FOR EACH ROW BEGIN UPDATE scheduling_job SET revision = OLD.revision + 1 WHERE id = NEW.id; END",
        ],
    }


def _run(statements: dict):
    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0030_jobevent_requeues_index")]

    operations = [migrations.RunPython(_run(_statements(WATCHED)), _run(_statements(RUNNING)))]
