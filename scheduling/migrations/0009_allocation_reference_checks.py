"""On PostgreSQL, an allocation's references to its job and GPU are checked once per statement
instead of once per row.

A foreign key checks each inserted row on its own at commit and takes a key-share lock on the
row it names: a cycle that places 100,000 GPUs pays 200,000 lookups and 100,000 row locks, about
three quarters of a second on the development machine. The same rules hold with set-based
triggers:

- an INSERT checks all its rows in one join each against cluster_gpu and scheduling_job;
- an allocation's job and GPU never change once written;
- deleting GPUs or jobs first takes a SHARE lock on scheduling_allocation (so every transaction
  still writing allocations has committed and no new one starts until this one ends), then
  refuses when any allocation, active or released, still names a deleted row. Django deletes
  the allocations of a job or GPU before the row itself, as the foreign key's CASCADE says.

SQLite keeps its foreign keys (one index probe per row, no row locks, a single writer): this
migration changes only Django's model state there. A later migration that rebuilds the SQLite
table from the model state would drop those foreign keys; re-add them then.
"""

from django.db import migrations, models
from django.db.models.deletion import CASCADE

_PG = """
DO $$
DECLARE name text;
BEGIN
    FOR name IN SELECT conname FROM pg_constraint
        WHERE conrelid = 'scheduling_allocation'::regclass AND contype = 'f'
    LOOP
        EXECUTE 'ALTER TABLE scheduling_allocation DROP CONSTRAINT ' || quote_ident(name);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION allocation_references_guard() RETURNS trigger AS $$
BEGIN
    -- one hash anti-join for the GPUs; the few distinct jobs probe the primary key
    IF EXISTS (SELECT 1 FROM written w LEFT JOIN cluster_gpu g ON g.id = w.gpu_id WHERE g.id IS NULL) THEN
        RAISE EXCEPTION 'allocation_references_guard: an allocation names a GPU that does not exist'
            USING ERRCODE = '23503';
    END IF;
    IF EXISTS (SELECT 1 FROM (SELECT DISTINCT job_id FROM written) w WHERE NOT EXISTS (
            SELECT 1 FROM scheduling_job j WHERE j.id = w.job_id)) THEN
        RAISE EXCEPTION 'allocation_references_guard: an allocation names a job that does not exist'
            USING ERRCODE = '23503';
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION allocation_references_fixed() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'allocation_references_guard: an allocation''s job and GPU never change'
        USING ERRCODE = '23503';
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION allocation_parent_lock() RETURNS trigger AS $$
BEGIN
    LOCK TABLE scheduling_allocation IN SHARE MODE;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

-- after a delete of GPUs or jobs: TG_ARGV[0] is the allocation column naming them, [1] their noun
CREATE OR REPLACE FUNCTION allocation_parent_delete_guard() RETURNS trigger AS $$
DECLARE named boolean;
BEGIN
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM scheduling_allocation a WHERE a.' || quote_ident(TG_ARGV[0])
        || ' IN (SELECT id FROM gone))' INTO named;
    IF named THEN
        RAISE EXCEPTION 'allocation_references_guard: a deleted % is still named by an allocation', TG_ARGV[1]
            USING ERRCODE = '23503';
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER allocation_references_insert AFTER INSERT ON scheduling_allocation
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION allocation_references_guard();
CREATE TRIGGER allocation_references_fixed BEFORE UPDATE OF job_id, gpu_id ON scheduling_allocation
    FOR EACH ROW WHEN (OLD.job_id IS DISTINCT FROM NEW.job_id OR OLD.gpu_id IS DISTINCT FROM NEW.gpu_id)
    EXECUTE FUNCTION allocation_references_fixed();
CREATE TRIGGER allocation_gpu_delete_lock BEFORE DELETE ON cluster_gpu
    FOR EACH STATEMENT EXECUTE FUNCTION allocation_parent_lock();
CREATE TRIGGER allocation_gpu_delete_guard AFTER DELETE ON cluster_gpu
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION allocation_parent_delete_guard('gpu_id', 'GPU');
CREATE TRIGGER allocation_job_delete_lock BEFORE DELETE ON scheduling_job
    FOR EACH STATEMENT EXECUTE FUNCTION allocation_parent_lock();
CREATE TRIGGER allocation_job_delete_guard AFTER DELETE ON scheduling_job
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION allocation_parent_delete_guard('job_id', 'job');
"""

_PG_DROP = """
DROP TRIGGER IF EXISTS allocation_references_insert ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_references_fixed ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_gpu_delete_lock ON cluster_gpu;
DROP TRIGGER IF EXISTS allocation_gpu_delete_guard ON cluster_gpu;
DROP TRIGGER IF EXISTS allocation_job_delete_lock ON scheduling_job;
DROP TRIGGER IF EXISTS allocation_job_delete_guard ON scheduling_job;
DROP FUNCTION IF EXISTS allocation_references_guard();
DROP FUNCTION IF EXISTS allocation_references_fixed();
DROP FUNCTION IF EXISTS allocation_parent_lock();
DROP FUNCTION IF EXISTS allocation_parent_delete_guard();
ALTER TABLE scheduling_allocation
    ADD CONSTRAINT scheduling_allocation_gpu_id_fk_cluster_gpu_id FOREIGN KEY (gpu_id)
        REFERENCES cluster_gpu (id) DEFERRABLE INITIALLY DEFERRED,
    ADD CONSTRAINT scheduling_allocation_job_id_fk_scheduling_job_id FOREIGN KEY (job_id)
        REFERENCES scheduling_job (id) DEFERRABLE INITIALLY DEFERRED;
"""


def to_triggers(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_PG, params=None)  # no placeholders: the SQL has % of its own


def to_foreign_keys(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_PG_DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0004_audit_records"),
        ("scheduling", "0008_sqlite_guard_split"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="allocation",
                    name="job",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=CASCADE,
                        related_name="allocations",
                        to="scheduling.job",
                    ),
                ),
                migrations.AlterField(
                    model_name="allocation",
                    name="gpu",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=CASCADE,
                        related_name="allocations",
                        to="cluster.gpu",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(to_triggers, to_foreign_keys)],
        ),
    ]
