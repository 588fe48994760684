# The inventory's revision: one row the database raises in the same transaction as any change to
# the topology's structure (cluster.models.InventoryRevision), so a scheduling cycle asks one row
# whether the inventory changed instead of counting every GPU. PostgreSQL: one statement-level
# trigger per table and statement; SQLite (row-level triggers only): one per row. The row is
# written by upsert, so a table emptied by a test's flush comes back with the next change.

from django.db import migrations, models

# table: the columns the snapshot is built from (an UPDATE of any other column, a node's state,
# a GPU's health, changes nothing here: the cycle reads those states every time)
WATCHED = {
    "cluster_chiptype": "name",
    "cluster_region": "name",
    "cluster_datacenter": "region_id, name",
    "cluster_pod": "datacenter_id, name",
    "cluster_rack": "pod_id, name",
    "cluster_node": "rack_id, chip_type_id, hostname",
    "cluster_gpu": 'node_id, "index"',
}
BUMP = (
    "INSERT INTO cluster_inventoryrevision (id, revision) VALUES (1, 1) "
    "ON CONFLICT (id) DO UPDATE SET revision = cluster_inventoryrevision.revision + 1"
)

POSTGRESQL = [
    f"CREATE FUNCTION cluster_inventory_changed() RETURNS trigger AS $$ BEGIN {BUMP}; RETURN NULL; END $$ "
    "LANGUAGE plpgsql",
    *(
        f"CREATE TRIGGER {table}_inventory AFTER INSERT OR DELETE OR TRUNCATE OR UPDATE OF {columns} "
        f"ON {table} FOR EACH STATEMENT EXECUTE FUNCTION cluster_inventory_changed()"
        for table, columns in WATCHED.items()
    ),
]
POSTGRESQL_UNDO = [
    *(f"DROP TRIGGER IF EXISTS {table}_inventory ON {table}" for table in WATCHED),
    "DROP FUNCTION IF EXISTS cluster_inventory_changed()",
]
SQLITE = [
    f"CREATE TRIGGER {table}_inventory_{event.split()[0].lower()} AFTER {event} ON {table} "
    f"FOR EACH ROW BEGIN {BUMP}; END"
    for table, columns in WATCHED.items()
    for event in ("INSERT", "DELETE", f"UPDATE OF {columns}")
]
SQLITE_UNDO = [
    f"DROP TRIGGER IF EXISTS {table}_inventory_{event}"
    for table in WATCHED
    for event in ("insert", "delete", "update")
]


def _run(statements: dict):
    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0009_chip_charge"),
    ]

    operations = [
        migrations.CreateModel(
            name="InventoryRevision",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("revision", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}),
            _run({"postgresql": POSTGRESQL_UNDO, "sqlite": SQLITE_UNDO}),
        ),
    ]
