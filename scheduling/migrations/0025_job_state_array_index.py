# The (state, array, id) index serves lookups by state, as job_state did, and each cycle's window
# on the pending jobs of every job array (scheduling.store.load_pending).

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('cluster', '0009_chip_charge'),
        ('scheduling', '0024_job_arrays'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['state', 'array', 'id'], name='job_state_array'),
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='job_state',
        ),
    ]
