"""Set columns of many rows at once: one UPDATE ... FROM unnest(...) on PostgreSQL, one prepared
executemany on SQLite. Django's bulk_update builds a CASE expression per row, which costs seconds
for the ten thousand pending reasons a busy cycle rewrites."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection


def update_rows(model, fields: Sequence[str], rows: Sequence[tuple]) -> None:
    """``rows`` are (pk, value of fields[0], value of fields[1], ...)."""
    if not rows:
        return
    meta = model._meta
    table = connection.ops.quote_name(meta.db_table)
    model_fields = [meta.get_field(f) for f in fields]
    columns = [connection.ops.quote_name(f.column) for f in model_fields]
    pk = connection.ops.quote_name(meta.pk.column)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            types = [meta.pk.db_type(connection).replace("serial", "integer")] + [
                f.rel_db_type(connection) if f.is_relation else f.db_type(connection) for f in model_fields
            ]
            arrays = ", ".join(f"%s::{t}[]" for t in types)
            names = ", ".join(["id", *[f"c{i}" for i in range(len(fields))]])
            sets = ", ".join(f"{col} = v.c{i}" for i, col in enumerate(columns))
            columns_data = list(zip(*rows, strict=True))
            cursor.execute(
                f"UPDATE {table} SET {sets} FROM unnest({arrays}) AS v({names}) WHERE {table}.{pk} = v.id",
                [list(col) for col in columns_data],
            )
        else:
            sets = ", ".join(f"{col} = %s" for col in columns)
            cursor.executemany(
                f"UPDATE {table} SET {sets} WHERE {pk} = %s", [(*row[1:], row[0]) for row in rows]
            )
