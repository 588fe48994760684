"""The allocations' triggers for rows per node and bank (migration 0034), the same rules as before:

- references (PostgreSQL, once per statement, as migration 0009 did for GPUs): every bit of a
  written row is a GPU of its node and the job exists; an allocation's job, node and bank never
  change and its GPUs never grow; deleting nodes or jobs waits for the transactions writing
  allocations and is refused while an allocation still names them. SQLite keeps its foreign keys
  and checks the bits per row.
- shared GPUs (migrations 0005, 0008, 0027): a whole allocation never takes a GPU that holds
  fractions, a fraction never joins a whole GPU, and the fractions of one GPU add up to at most
  1000 (a fraction holds one bit, so rows of one GPU have the same node, bank and slots).
- totals (PostgreSQL, migration 0028): what the active rows add up to, kept per statement, so a
  cycle asks "did anyone else change an allocation?" by reading a few rows. ``gpu_sum`` now sums
  each row's place (node id x 16 + bank) and the mix hashes job, place and slots.
"""

from django.db import migrations

PLACE = "(node_id * 16 + bank)"
MIX = f"((job_id * 2654435761 + {PLACE} * 40503 + slots * 69069) % 1000000007)"  # scheduling.store.MIX

# the bits of a row that are GPUs of its node (w: the row)
_GPU_BITS = (
    'SELECT COALESCE(SUM(1 << (g."index" % 8)), 0) FROM cluster_gpu g '
    'WHERE g.node_id = {w}.node_id AND g."index" / 8 = {w}.bank AND ({w}.slots & (1 << (g."index" % 8))) <> 0'
)

_PG_REFERENCES = f"""
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
    -- each written row probes its node's GPUs (the unique index on node and index)
    IF EXISTS (SELECT 1 FROM written w WHERE w.slots <> ({_GPU_BITS.format(w="w")} OFFSET 0)) THEN
        RAISE EXCEPTION 'allocation_references_guard: an allocation names a GPU that does not exist'
            USING ERRCODE = '23503';
    END IF;
    IF EXISTS (SELECT 1 FROM (SELECT DISTINCT job_id FROM written) w WHERE NOT EXISTS (
            SELECT 1 FROM scheduling_job j WHERE j.id = w.job_id OFFSET 0)) THEN
        RAISE EXCEPTION 'allocation_references_guard: an allocation names a job that does not exist'
            USING ERRCODE = '23503';
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION allocation_references_fixed() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'allocation_references_guard: an allocation''s job, node and bank never change and its GPUs never grow'
        USING ERRCODE = '23503';
END $$ LANGUAGE plpgsql;

CREATE TRIGGER allocation_references_insert AFTER INSERT ON scheduling_allocation
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION allocation_references_guard();
CREATE TRIGGER allocation_references_fixed BEFORE UPDATE ON scheduling_allocation
    FOR EACH ROW WHEN (OLD.job_id IS DISTINCT FROM NEW.job_id OR OLD.node_id IS DISTINCT FROM NEW.node_id
        OR OLD.bank IS DISTINCT FROM NEW.bank OR (OLD.slots | NEW.slots) <> OLD.slots)
    EXECUTE FUNCTION allocation_references_fixed();
CREATE TRIGGER allocation_node_delete_lock BEFORE DELETE ON cluster_node
    FOR EACH STATEMENT EXECUTE FUNCTION allocation_parent_lock();
CREATE TRIGGER allocation_node_delete_guard AFTER DELETE ON cluster_node
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION allocation_parent_delete_guard('node_id', 'node');
CREATE TRIGGER allocation_job_delete_lock BEFORE DELETE ON scheduling_job
    FOR EACH STATEMENT EXECUTE FUNCTION allocation_parent_lock();
CREATE TRIGGER allocation_job_delete_guard AFTER DELETE ON scheduling_job
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION allocation_parent_delete_guard('job_id', 'job');
"""

_PG_SHARED = """
CREATE OR REPLACE FUNCTION shared_gpu_guard() RETURNS trigger AS $$
BEGIN
    -- whole GPUs written onto GPUs that hold fractions (asked only when any fraction is held)
    IF EXISTS (SELECT 1 FROM written WHERE active AND share = 1000)
       AND (SELECT node_id FROM scheduling_allocation WHERE active AND share < 1000
            ORDER BY node_id, bank LIMIT 1) IS NOT NULL
       AND EXISTS (
            SELECT 1 FROM written w
            WHERE w.active AND w.share = 1000 AND EXISTS (
                SELECT 1 FROM scheduling_allocation a
                WHERE a.node_id = w.node_id AND a.bank = w.bank AND a.active AND a.share < 1000
                  AND (a.slots & w.slots) <> 0)) THEN
        RAISE EXCEPTION 'shared_gpu_guard: a whole-GPU allocation and a shared one on the same GPU'
            USING ERRCODE = '23514';
    END IF;
    IF EXISTS (SELECT 1 FROM written WHERE active AND share < 1000) THEN
        IF EXISTS (
            SELECT 1 FROM written w
            WHERE w.active AND w.share < 1000 AND EXISTS (
                SELECT 1 FROM scheduling_allocation a
                WHERE a.node_id = w.node_id AND a.bank = w.bank AND a.active AND a.share = 1000
                  AND (a.slots & w.slots) <> 0)
        ) THEN
            RAISE EXCEPTION 'shared_gpu_guard: a whole-GPU allocation and a shared one on the same GPU'
                USING ERRCODE = '23514';
        END IF;
        IF EXISTS (
            SELECT 1 FROM scheduling_allocation a
            WHERE a.active AND a.share < 1000 AND (a.node_id, a.bank, a.slots) IN (
                SELECT node_id, bank, slots FROM written WHERE active AND share < 1000)
            GROUP BY a.node_id, a.bank, a.slots HAVING SUM(a.share) > 1000
        ) THEN
            RAISE EXCEPTION 'shared_gpu_guard: the shares of a GPU add up to more than 1000'
                USING ERRCODE = '23514';
        END IF;
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;

CREATE TRIGGER shared_gpu_guard_insert AFTER INSERT ON scheduling_allocation
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION shared_gpu_guard();
CREATE TRIGGER shared_gpu_guard_update AFTER UPDATE ON scheduling_allocation
    REFERENCING NEW TABLE AS written FOR EACH STATEMENT EXECUTE FUNCTION shared_gpu_guard();
"""

_PG_TOTALS = f"""
CREATE OR REPLACE FUNCTION allocation_totals_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM scheduling_allocationtotals;
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO scheduling_allocationtotals (count, job_sum, gpu_sum, mix_sum)
        SELECT COUNT(*), SUM(job_id), SUM({PLACE}), SUM({MIX}) FROM written WHERE active
        HAVING COUNT(*) > 0;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO scheduling_allocationtotals (count, job_sum, gpu_sum, mix_sum)
        SELECT -COUNT(*), -SUM(job_id), -SUM({PLACE}), -SUM({MIX}) FROM gone WHERE active
        HAVING COUNT(*) > 0;
    ELSE
        INSERT INTO scheduling_allocationtotals (count, job_sum, gpu_sum, mix_sum)
        SELECT SUM(sign), SUM(sign * job_id), SUM(sign * {PLACE}), SUM(sign * {MIX}) FROM (
            SELECT 1 AS sign, job_id, node_id, bank, slots FROM written WHERE active
            UNION ALL
            SELECT -1, job_id, node_id, bank, slots FROM gone WHERE active
        ) AS changed
        HAVING SUM(sign) <> 0 OR SUM(sign * job_id) <> 0 OR SUM(sign * {PLACE}) <> 0
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

DELETE FROM scheduling_allocationtotals;
INSERT INTO scheduling_allocationtotals (count, job_sum, gpu_sum, mix_sum)
    SELECT COUNT(*), COALESCE(SUM(job_id), 0), COALESCE(SUM({PLACE}), 0), COALESCE(SUM({MIX}), 0)
    FROM scheduling_allocation WHERE active;
"""

_SQLITE_WHOLE = """
BEGIN
    SELECT RAISE(ABORT, 'shared_gpu_guard: a whole-GPU allocation and a shared one on the same GPU')
    WHERE EXISTS (SELECT 1 FROM scheduling_allocation WHERE node_id = NEW.node_id AND bank = NEW.bank
                  AND active AND share < 1000 AND (slots & NEW.slots) <> 0);
END;
"""
_SQLITE_SHARED = """
BEGIN
    SELECT RAISE(ABORT, 'shared_gpu_guard: a whole-GPU allocation and a shared one on the same GPU')
    WHERE EXISTS (SELECT 1 FROM scheduling_allocation WHERE node_id = NEW.node_id AND bank = NEW.bank
                  AND active AND share = 1000 AND (slots & NEW.slots) <> 0);
    SELECT RAISE(ABORT, 'shared_gpu_guard: the shares of a GPU add up to more than 1000')
    WHERE NEW.share + (
        SELECT COALESCE(SUM(share), 0) FROM scheduling_allocation
        WHERE node_id = NEW.node_id AND bank = NEW.bank AND slots = NEW.slots AND active AND share < 1000) > 1000;
END;
"""
_SQLITE_BITS = f"""
BEGIN
    SELECT RAISE(ABORT, 'allocation_references_guard: an allocation names a GPU that does not exist')
    WHERE NEW.slots <> ({_GPU_BITS.format(w="NEW")});
END;
"""
_SQLITE = [
    "CREATE TRIGGER allocation_gpus_exist BEFORE INSERT ON scheduling_allocation" + _SQLITE_BITS,
    "CREATE TRIGGER allocation_references_fixed BEFORE UPDATE ON scheduling_allocation "
    "WHEN OLD.job_id IS NOT NEW.job_id OR OLD.node_id IS NOT NEW.node_id OR OLD.bank IS NOT NEW.bank "
    "OR (OLD.slots | NEW.slots) <> OLD.slots BEGIN SELECT RAISE(ABORT, 'allocation_references_guard: "
    "an allocation''s job, node and bank never change and its GPUs never grow'); END;",
    "CREATE TRIGGER shared_gpu_guard_insert_whole BEFORE INSERT ON scheduling_allocation "
    "WHEN NEW.active AND NEW.share = 1000" + _SQLITE_WHOLE,
    "CREATE TRIGGER shared_gpu_guard_insert_shared BEFORE INSERT ON scheduling_allocation "
    "WHEN NEW.active AND NEW.share < 1000" + _SQLITE_SHARED,
    "CREATE TRIGGER shared_gpu_guard_update_whole BEFORE UPDATE OF active ON scheduling_allocation "
    "WHEN NEW.active AND NOT OLD.active AND NEW.share = 1000" + _SQLITE_WHOLE,
    "CREATE TRIGGER shared_gpu_guard_update_shared BEFORE UPDATE OF active ON scheduling_allocation "
    "WHEN NEW.active AND NOT OLD.active AND NEW.share < 1000" + _SQLITE_SHARED,
]


def add(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for sql in (_PG_REFERENCES, _PG_SHARED, _PG_TOTALS):
            schema_editor.execute(sql, params=None)  # no placeholders: % is the modulo
    else:
        for sql in _SQLITE:
            schema_editor.execute(sql)


_PG_DROP = """
DROP TRIGGER IF EXISTS allocation_references_insert ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_references_fixed ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_node_delete_lock ON cluster_node;
DROP TRIGGER IF EXISTS allocation_node_delete_guard ON cluster_node;
DROP TRIGGER IF EXISTS allocation_job_delete_lock ON scheduling_job;
DROP TRIGGER IF EXISTS allocation_job_delete_guard ON scheduling_job;
DROP TRIGGER IF EXISTS shared_gpu_guard_insert ON scheduling_allocation;
DROP TRIGGER IF EXISTS shared_gpu_guard_update ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_insert ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_update ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_delete ON scheduling_allocation;
DROP TRIGGER IF EXISTS allocation_totals_truncate ON scheduling_allocation;
"""
_SQLITE_NAMES = (
    "allocation_gpus_exist",
    "allocation_references_fixed",
    "shared_gpu_guard_insert_whole",
    "shared_gpu_guard_insert_shared",
    "shared_gpu_guard_update_whole",
    "shared_gpu_guard_update_shared",
)


def drop(apps, schema_editor):
    """Back to migration 0034: the triggers are gone (0034 going back restores the table per GPU
    without its old triggers)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_PG_DROP)
    else:
        for name in _SQLITE_NAMES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0034_allocations_per_node")]

    operations = [migrations.RunPython(add, drop)]
