"""Set columns of many rows at once: one UPDATE ... FROM a JSON document on PostgreSQL, one prepared
executemany on SQLite. Django's bulk_update builds a CASE expression per row, which costs seconds
for the ten thousand pending reasons a busy cycle rewrites."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from django.db import connection


def _json_value(value):
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"update_rows cannot send {type(value).__name__} values")


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
            # The rows travel as one JSON document (json.dumps runs in C; adapting ten thousand
            # strings into PostgreSQL arrays runs in Python) and are cast back column by column.
            types = [meta.pk.db_type(connection).replace("serial", "integer")] + [
                f.rel_db_type(connection) if f.is_relation else f.db_type(connection) for f in model_fields
            ]
            values = ", ".join(f"(x->>{i})::{t} AS c{i}" for i, t in enumerate(types))
            sets = ", ".join(f"{col} = v.c{i + 1}" for i, col in enumerate(columns))
            cursor.execute(
                f"UPDATE {table} SET {sets} FROM (SELECT {values} FROM jsonb_array_elements(%s::jsonb) x) v "
                f"WHERE {table}.{pk} = v.c0",
                [json.dumps(rows, default=_json_value)],
            )
        else:
            sets = ", ".join(f"{col} = %s" for col in columns)
            cursor.executemany(
                f"UPDATE {table} SET {sets} WHERE {pk} = %s", [(*row[1:], row[0]) for row in rows]
            )
