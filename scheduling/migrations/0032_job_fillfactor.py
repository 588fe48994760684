# PostgreSQL keeps half of each new page of the job table free (fillfactor 50), so that a pending
# job's new reason is written beside its old row: a heap-only update, no index touched (the reason
# is in none of the table's ten indexes). A row written elsewhere costs an entry in every index,
# and a cycle writes the reasons of thousands of pending jobs: a fill of 10,000 jobs on the 100k
# preset wrote its 9,600 reasons in 321-334 ms at the default fillfactor, 196-201 ms at 70 and
# 135-181 ms at 50 (in process, this machine). The cost is room: the job table's pages hold half
# the rows, finished jobs' pages included. Pages written before this keep theirs until the table
# is rewritten (VACUUM FULL); jobs are written all the time, so the pending ones soon sit on new
# pages. SQLite writes only the indexes whose columns change: nothing to do there.

from django.db import migrations


def _run(sql: str):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0031_job_revision_pending_columns")]

    operations = [
        migrations.RunPython(
            _run("ALTER TABLE scheduling_job SET (fillfactor = 50)"),
            _run("ALTER TABLE scheduling_job RESET (fillfactor)"),
        )
    ]
