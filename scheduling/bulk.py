"""Set columns of many rows at once: one UPDATE ... FROM a JSON document on PostgreSQL, one prepared
executemany on SQLite. Django's bulk_update builds a CASE expression per row, which costs seconds
for the ten thousand pending reasons a busy cycle rewrites."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction


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
            adapt = _sqlite_adapters(model_fields)
            if any(adapt):  # a JSON document or a datetime among the columns
                params = [
                    (*(a(v) if a else v for a, v in zip(adapt, r[1:], strict=True)), r[0]) for r in rows
                ]
            else:
                params = [(*row[1:], row[0]) for row in rows]
            cursor.executemany(f"UPDATE {table} SET {sets} WHERE {pk} = %s", params)


def _sqlite_adapters(model_fields) -> list:
    """Per field, how a value is written where sqlite3 cannot take it as it is (a JSON document,
    a datetime as Django stores it); None where it can (text and numbers, most of the columns)."""
    out = []
    for field in model_fields:
        kind = field.get_internal_type()
        if kind == "JSONField":
            out.append(lambda value, field=field: field.get_db_prep_save(value, connection))
        elif kind == "DateTimeField":
            out.append(connection.ops.adapt_datetimefield_value)
        else:
            out.append(None)
    return out


_insert_statements: dict[tuple, tuple] = {}


def _insert_statement(model) -> tuple[str, list]:
    """(INSERT ... VALUES (%s, ...) without RETURNING, fields in order) for one new row."""
    meta = model._meta
    key = (model, connection.vendor)
    cached = _insert_statements.get(key)
    if cached is None:
        qn = connection.ops.quote_name
        fields = [f for f in meta.concrete_fields if f is not meta.auto_field and not f.generated]
        columns = ", ".join(qn(f.column) for f in fields)
        marks = ", ".join(["%s"] * len(fields))
        cached = _insert_statements[key] = (
            f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES ({marks})",
            fields,
        )
    return cached


def _params(instance, fields) -> list:
    return [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]


def _saved(instance, pk) -> None:
    setattr(instance, instance._meta.pk.attname, pk)
    instance._state.adding = False
    instance._state.db = connection.alias


def insert_row(instance) -> None:
    """Insert one new model instance as ``save()`` would (field defaults, ``auto_now_add``, the
    database's adaptation of every value), from an INSERT built once per model and database. On
    the submit path the ORM spends longer building the statement than the database spends running
    it. No model signals are sent (the project connects none)."""
    sql, fields = _insert_statement(type(instance))
    returning = connection.features.can_return_columns_from_insert
    if returning:
        sql += f" RETURNING {connection.ops.quote_name(instance._meta.pk.column)}"
    with connection.cursor() as cursor:
        cursor.execute(sql, _params(instance, fields))
        pk = cursor.fetchone()[0] if returning else cursor.lastrowid
    _saved(instance, pk)


def insert_with_child(parent, child, link: str) -> None:
    """Insert a new row and a new row that points at it (``link``: the child's foreign key to
    the parent), both or neither. On PostgreSQL this is one statement, so one round trip and no
    transaction of its own; elsewhere two inserts in a transaction."""
    if connection.vendor != "postgresql":
        with transaction.atomic():
            insert_row(parent)
            setattr(child, link, parent)
            insert_row(child)
        return
    sql, parent_fields, others = _linked_insert_statement(type(parent), type(child), link)
    with connection.cursor() as cursor:
        cursor.execute(sql, _params(parent, parent_fields) + _params(child, others))
        child_pk, parent_pk = cursor.fetchone()
    _saved(parent, parent_pk)
    setattr(child, link, parent)
    _saved(child, child_pk)


def _linked_insert_statement(parent_model, child_model, link: str) -> tuple[str, list, list]:
    """(SQL, parent fields, child fields but the link) of PostgreSQL's one-statement insert of a
    row and a row pointing at it, built once per pair of models."""
    key = (parent_model, child_model, link, connection.vendor)
    cached = _insert_statements.get(key)
    if cached is not None:
        return cached
    qn = connection.ops.quote_name
    parent_sql, parent_fields = _insert_statement(parent_model)
    _, child_fields = _insert_statement(child_model)
    link_field = child_model._meta.get_field(link)
    others = [f for f in child_fields if f is not link_field]
    parent_pk, child_meta = qn(parent_model._meta.pk.column), child_model._meta
    columns = ", ".join([qn(link_field.column), *(qn(f.column) for f in others)])
    sql = (
        f"WITH p AS ({parent_sql} RETURNING {parent_pk}) "
        f"INSERT INTO {qn(child_meta.db_table)} ({columns}) "
        f"SELECT p.{parent_pk}, {', '.join(['%s'] * len(others))} FROM p "
        f"RETURNING {qn(child_meta.pk.column)}, {qn(link_field.column)}"
    )
    cached = _insert_statements[key] = (sql, parent_fields, others)
    return cached


def insert_copies(instance, field: str, values: Sequence[int]) -> None:
    """Insert one row per value: copies of the unsaved ``instance`` with the integer ``field`` set
    to each value, in one statement whatever their number (the values travel as one JSON array,
    the rest of the row once). A 10,000-job array and its submitted events are two statements."""
    if not len(values):
        return
    meta = type(instance)._meta
    qn = connection.ops.quote_name
    _, fields = _insert_statement(type(instance))
    varying = meta.get_field(field)
    params, selected = [], []
    pg = connection.vendor == "postgresql"
    for f, value in zip(fields, _params(instance, fields), strict=True):
        # PostgreSQL infers no type for a parameter in a SELECT list: each gets its column's
        kind = f.rel_db_type(connection) if f.is_relation else f.db_type(connection)
        if f is varying:
            selected.append(f"(v.value)::{kind}" if pg else "v.value")
            continue
        selected.append(f"%s::{kind}" if pg else "%s")
        params.append(value)
    source = "jsonb_array_elements_text(%s::jsonb) AS v(value)" if pg else "json_each(%s) AS v"
    columns = ", ".join(qn(f.column) for f in fields)
    sql = f"INSERT INTO {qn(meta.db_table)} ({columns}) SELECT {', '.join(selected)} FROM {source}"
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, json.dumps([int(v) for v in values])])


def insert_plain(objects: Sequence, model=None) -> None:
    """Insert new instances of one model whose fields hold plain values (numbers, text, dates,
    JSON of plain values), in one statement: the rows travel as one JSON document that the
    database unpacks itself. Thousands of a cycle's events cost a few milliseconds, where
    ``bulk_create`` prepares every field of every row in Python. No ids are set on the objects.
    ``model``: the model written (default: the first object's class); any object with its
    fields' attributes may stand for an instance."""
    if not objects:
        return
    model = model or type(objects[0])
    meta = model._meta
    qn = connection.ops.quote_name
    _, fields = _insert_statement(model)
    pg = connection.vendor == "postgresql"
    stamps: dict = {}  # a cycle's objects share a handful of timestamps: adapt each once

    def stamp(value):
        if value is None:
            return None
        if value not in stamps:
            stamps[value] = value.isoformat() if pg else connection.ops.adapt_datetimefield_value(value)
        return stamps[value]

    getters = []
    for f in fields:
        if f.get_internal_type() == "DateTimeField":
            getters.append(lambda o, a=f.attname: stamp(getattr(o, a)))
        else:
            getters.append(lambda o, a=f.attname: getattr(o, a))
    rows = [[get(o) for get in getters] for o in objects]
    selected = []
    for i, f in enumerate(fields):
        if f.get_internal_type() == "JSONField":
            selected.append(f"x->{i}" if pg else f"x.value->'$[{i}]'")  # the JSON itself
        elif pg:
            kind = f.rel_db_type(connection) if f.is_relation else f.db_type(connection)
            selected.append(f"(x->>{i})::{kind}")
        else:
            selected.append(f"x.value->>{i}")
    source = "jsonb_array_elements(%s::jsonb) x" if pg else "json_each(%s) AS x"
    columns = ", ".join(qn(f.column) for f in fields)
    sql = f"INSERT INTO {qn(meta.db_table)} ({columns}) SELECT {', '.join(selected)} FROM {source}"
    with connection.cursor() as cursor:
        cursor.execute(sql, [json.dumps(rows)])
