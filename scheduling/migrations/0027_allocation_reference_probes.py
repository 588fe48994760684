# The check that an inserted allocation names an existing GPU and job (migration 0009) probes the
# primary keys row by row instead of joining the whole inventory: as a join, PostgreSQL's planner
# hashed all 100,000 GPUs for any insert (the transition table has no statistics), 20-26 ms for
# the 1,024 rows of one gang, against 1.3 ms probed; a 50,000-row fill costs the same either way
# (46 ms). OFFSET 0 keeps each NOT EXISTS a per-row subplan (the planner does not turn it into a
# join). The rule is unchanged; SQLite keeps its foreign keys.
#
# The shared-GPU guard (migration 0005) asked first whether any shared allocation is active, a
# probe its partial index answers at once, but which the planner ran as a scan of the whole table
# (7-8 ms at 100k allocations) whenever the table's statistics were stale (a new table, or a
# server with autovacuum off), and it did so for every insert and every release. It now asks the
# rows written first (a release writes no active row and checks nothing), and the probe is a
# scalar subquery ordered by the index's key (inside EXISTS the planner drops ORDER BY and LIMIT),
# so no statistics make a scan look cheaper. Same rules, same errors.

from django.db import migrations

_PG = """
CREATE OR REPLACE FUNCTION allocation_references_guard() RETURNS trigger AS $$
BEGIN
    -- each written row probes the GPUs' primary key; the few distinct jobs probe the jobs'
    IF EXISTS (SELECT 1 FROM written w WHERE NOT EXISTS (
            SELECT 1 FROM cluster_gpu g WHERE g.id = w.gpu_id OFFSET 0)) THEN
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

CREATE OR REPLACE FUNCTION shared_gpu_guard() RETURNS trigger AS $$
BEGIN
    -- whole GPUs written onto GPUs that hold fractions
    IF EXISTS (SELECT 1 FROM written WHERE active AND share = 1000) THEN
        IF (SELECT gpu_id FROM scheduling_allocation WHERE active AND share < 1000
            ORDER BY gpu_id LIMIT 1) IS NOT NULL
           AND EXISTS (
            SELECT 1 FROM written w
            WHERE w.active AND w.share = 1000 AND w.gpu_id IN (
                SELECT a.gpu_id FROM scheduling_allocation a WHERE a.active AND a.share < 1000)
        ) THEN
            RAISE EXCEPTION 'shared_gpu_guard: a whole-GPU allocation and a shared one on the same GPU'
                USING ERRCODE = '23514';
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM written WHERE active AND share < 1000) THEN
        -- fractions written onto whole GPUs (probes the unique index of whole GPUs)
        IF EXISTS (
            SELECT 1 FROM written w
            WHERE w.active AND w.share < 1000 AND EXISTS (
                SELECT 1 FROM scheduling_allocation a
                WHERE a.gpu_id = w.gpu_id AND a.active AND a.share = 1000)
        ) THEN
            RAISE EXCEPTION 'shared_gpu_guard: a whole-GPU allocation and a shared one on the same GPU'
                USING ERRCODE = '23514';
        END IF;
        IF EXISTS (
            SELECT 1 FROM scheduling_allocation
            WHERE active AND share < 1000
              AND gpu_id IN (SELECT gpu_id FROM written WHERE active AND share < 1000)
            GROUP BY gpu_id HAVING SUM(share) > 1000
        ) THEN
            RAISE EXCEPTION 'shared_gpu_guard: the shares of a GPU add up to more than 1000'
                USING ERRCODE = '23514';
        END IF;
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""

_SHARED_BACK = """
CREATE OR REPLACE FUNCTION shared_gpu_guard() RETURNS trigger AS $$
BEGIN
    -- whole GPUs written onto GPUs that hold fractions (probes the small shared_gpu index)
    IF EXISTS (SELECT 1 FROM scheduling_allocation WHERE active AND share < 1000 LIMIT 1)
       AND EXISTS (
        SELECT 1 FROM written w
        WHERE w.active AND w.share = 1000 AND w.gpu_id IN (
            SELECT a.gpu_id FROM scheduling_allocation a WHERE a.active AND a.share < 1000)
    ) THEN
        RAISE EXCEPTION 'shared_gpu_guard: a whole-GPU allocation and a shared one on the same GPU'
            USING ERRCODE = '23514';
    END IF;
    IF EXISTS (SELECT 1 FROM written WHERE active AND share < 1000) THEN
        -- fractions written onto whole GPUs (probes the unique index of whole GPUs)
        IF EXISTS (
            SELECT 1 FROM written w
            WHERE w.active AND w.share < 1000 AND EXISTS (
                SELECT 1 FROM scheduling_allocation a
                WHERE a.gpu_id = w.gpu_id AND a.active AND a.share = 1000)
        ) THEN
            RAISE EXCEPTION 'shared_gpu_guard: a whole-GPU allocation and a shared one on the same GPU'
                USING ERRCODE = '23514';
        END IF;
        IF EXISTS (
            SELECT 1 FROM scheduling_allocation
            WHERE active AND share < 1000
              AND gpu_id IN (SELECT gpu_id FROM written WHERE active AND share < 1000)
            GROUP BY gpu_id HAVING SUM(share) > 1000
        ) THEN
            RAISE EXCEPTION 'shared_gpu_guard: the shares of a GPU add up to more than 1000'
                USING ERRCODE = '23514';
        END IF;
    END IF;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
"""

_PG_BACK = (
    """
CREATE OR REPLACE FUNCTION allocation_references_guard() RETURNS trigger AS $$
BEGIN
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
"""
    + _SHARED_BACK
)


def _run(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0026_job_revision"),
    ]

    operations = [migrations.RunPython(_run(_PG), _run(_PG_BACK))]
