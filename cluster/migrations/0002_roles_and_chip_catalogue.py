from django.db import migrations


def forwards(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ("viewer", "operator"):
        Group.objects.get_or_create(name=name)
    ChipType = apps.get_model("cluster", "ChipType")
    from engine.chips import CATALOGUE

    existing = set(ChipType.objects.values_list("name", flat=True))
    ChipType.objects.bulk_create(ChipType(**c.as_dict()) for c in CATALOGUE if c.name not in existing)


class Migration(migrations.Migration):
    dependencies = [("cluster", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
