"""Two indexes fewer on jobs (queue alone is served by (queue, state); state's LIKE-pattern index
served no query), and on PostgreSQL jobs keep 30% of each page free: a cycle rewrites the pending
reason of thousands of jobs, and with room on the page PostgreSQL updates them in place without
touching any index (a heap-only update)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def fillfactor(percent):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE scheduling_job SET (fillfactor = {int(percent)})")

    return apply


class Migration(migrations.Migration):

    dependencies = [
        ('cluster', '0004_audit_records'),
        ('scheduling', '0009_allocation_reference_checks'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='queue',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='scheduling.queue'),
        ),
        migrations.AlterField(
            model_name='job',
            name='state',
            field=models.CharField(choices=[('pending', 'Pending'), ('running', 'Running'), ('suspended', 'Suspended'), ('finished', 'Finished'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='pending', max_length=16),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['state'], name='job_state'),
        ),
        migrations.RunPython(fillfactor(70), fillfactor(100)),
    ]
