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


_insert_statements: dict[tuple, tuple[str, list]] = {}


def insert_row(instance) -> None:
    """Insert one new model instance as ``save()`` would (field defaults, ``auto_now_add``, the
    database's adaptation of every value), from an INSERT built once per model and database. On
    the submit path the ORM spends longer building the statement than the database spends running
    it. No model signals are sent (the project connects none)."""
    model = type(instance)
    meta = model._meta
    key = (model, connection.vendor)
    cached = _insert_statements.get(key)
    if cached is None:
        qn = connection.ops.quote_name
        fields = [f for f in meta.concrete_fields if f is not meta.auto_field and not f.generated]
        columns = ", ".join(qn(f.column) for f in fields)
        marks = ", ".join(["%s"] * len(fields))
        sql = f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES ({marks})"
        if connection.features.can_return_columns_from_insert:
            sql += f" RETURNING {qn(meta.pk.column)}"
        cached = _insert_statements[key] = (sql, fields)
    sql, fields = cached
    params = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        pk = cursor.fetchone()[0] if connection.features.can_return_columns_from_insert else cursor.lastrowid
    setattr(instance, meta.pk.attname, pk)
    instance._state.adding = False
    instance._state.db = connection.alias
