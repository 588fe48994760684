# Job.revision, raised by the database on every UPDATE that names a column the scheduler reads of
# a running job (scheduling.running): a BEFORE trigger on PostgreSQL, an AFTER trigger on SQLite
# (which cannot assign NEW). Any writer, the ORM, bulk statements or raw SQL, raises it alike.

from django.db import migrations, models

# what scheduling.running.COLUMNS reads, with the queue, the chip and the state
WATCHED = (
    "state, queue_id, chip_id, priority, started_at, estimated_duration_s, last_checkpoint_at, "
    "min_gpus, gpus, size_step, topology, share, mixed_chips, array_id"
)

POSTGRESQL = [
    "CREATE FUNCTION scheduling_job_revision() RETURNS trigger AS $$ "
    "BEGIN NEW.revision := OLD.revision + 1; RETURN NEW; END $$ LANGUAGE plpgsql",
    f"CREATE TRIGGER scheduling_job_revision BEFORE UPDATE OF {WATCHED} ON scheduling_job "
    "FOR EACH ROW EXECUTE FUNCTION scheduling_job_revision()",
]
POSTGRESQL_UNDO = [
    "DROP TRIGGER IF EXISTS scheduling_job_revision ON scheduling_job",
    "DROP FUNCTION IF EXISTS scheduling_job_revision()",
]
SQLITE = [
    f"CREATE TRIGGER scheduling_job_revision AFTER UPDATE OF {WATCHED} ON scheduling_job "
    "FOR EACH ROW BEGIN UPDATE scheduling_job SET revision = OLD.revision + 1 WHERE id = NEW.id; END",
]
SQLITE_UNDO = ["DROP TRIGGER IF EXISTS scheduling_job_revision"]


def _run(statements: dict):
    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0025_job_state_array_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='revision',
            field=models.BigIntegerField(default=0, editable=False),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['state', 'id', 'revision'], name='job_state_revision'),
        ),
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}),
            _run({"postgresql": POSTGRESQL_UNDO, "sqlite": SQLITE_UNDO}),
        ),
    ]
