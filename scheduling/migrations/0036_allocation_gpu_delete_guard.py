"""A GPU that an active allocation holds cannot be deleted (the rule migration 0009 kept for rows
per GPU, now for rows per node and bank). Released allocations are history and do not keep a GPU
in the inventory. Deleting a node through the ORM still works: its allocations go first (CASCADE),
then its GPUs. On PostgreSQL a delete of GPUs first waits for the transactions writing allocations
(the SHARE lock of migration 0009), then checks once per statement; SQLite checks each row.
"""

from django.db import migrations

_HELD = (
    "SELECT 1 FROM scheduling_allocation a WHERE a.active AND a.node_id = {g}.node_id "
    'AND a.bank = {g}."index" / 8 AND (a.slots & (1 << ({g}."index" % 8))) <> 0'
)
_MESSAGE = "allocation_references_guard: a deleted GPU is held by an active allocation"

_PG = f"""
CREATE OR REPLACE FUNCTION allocation_gpu_delete_guard() RETURNS trigger AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM gone g WHERE EXISTS ({_HELD.format(g="g")})) THEN
        RAISE EXCEPTION '{_MESSAGE}' USING ERRCODE = '23503';
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER allocation_gpu_delete_lock BEFORE DELETE ON cluster_gpu
    FOR EACH STATEMENT EXECUTE FUNCTION allocation_parent_lock();
CREATE TRIGGER allocation_gpu_delete_guard AFTER DELETE ON cluster_gpu
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION allocation_gpu_delete_guard();
"""
_PG_DROP = """
DROP TRIGGER IF EXISTS allocation_gpu_delete_lock ON cluster_gpu;
DROP TRIGGER IF EXISTS allocation_gpu_delete_guard ON cluster_gpu;
DROP FUNCTION IF EXISTS allocation_gpu_delete_guard();
"""
_SQLITE = (
    "CREATE TRIGGER allocation_gpu_delete_guard BEFORE DELETE ON cluster_gpu BEGIN "
    f"SELECT RAISE(ABORT, '{_MESSAGE}') WHERE EXISTS ({_HELD.format(g='OLD')}); END;"
)


def add(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_PG, params=None)  # no placeholders: % is the modulo
    else:
        schema_editor.execute(_SQLITE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_PG_DROP)
    else:
        schema_editor.execute("DROP TRIGGER IF EXISTS allocation_gpu_delete_guard")


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0035_allocation_triggers_per_node")]

    operations = [migrations.RunPython(add, drop)]
