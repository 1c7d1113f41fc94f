"""``information_schema.tables`` and ``.columns``: the node's tables as the relations SQL
sees, for tools that list what they can query.

Each view is a handful of rows built from the table list; a SELECT over it
(columns, WHERE with comparisons, LIKE, IN, AND/OR/NOT, IS NULL, ORDER BY,
LIMIT) is evaluated here on those rows.
"""

from __future__ import annotations

import re
from typing import Any

from sqlglot import exp

from tablecast.pg.relations import DATABASE, Rows, SqlError, Tables, table_columns, unsupported
from tablecast.pg.types import INT4, TEXT, PgType

TABLES_COLUMNS: tuple[tuple[str, PgType], ...] = (
    ("table_catalog", TEXT),
    ("table_schema", TEXT),
    ("table_name", TEXT),
    ("table_type", TEXT),
    ("is_insertable_into", TEXT),
)
COLUMNS_COLUMNS: tuple[tuple[str, PgType], ...] = (
    ("table_catalog", TEXT),
    ("table_schema", TEXT),
    ("table_name", TEXT),
    ("column_name", TEXT),
    ("ordinal_position", INT4),
    ("is_nullable", TEXT),
    ("data_type", TEXT),
)


def _relations(name: str, tables: Tables) -> tuple[tuple[tuple[str, PgType], ...], list[dict]]:  # type: ignore[type-arg]
    # a window table is no relation of its own (tablecast.windows reads it), as in pg_catalog
    infos = sorted((i for i in tables.listing() if i.kind == "kv"), key=lambda i: i.name)
    if name == "tables":
        rows = [
            {
                "table_catalog": DATABASE,
                "table_schema": "public",
                "table_name": i.name,
                "table_type": "BASE TABLE",
                "is_insertable_into": "NO",
            }
            for i in infos
        ]
        return TABLES_COLUMNS, rows
    if name == "columns":
        rows = []
        for i in infos:
            for n, (col, t) in enumerate(table_columns(i), 1):
                rows.append(
                    {
                        "table_catalog": DATABASE,
                        "table_schema": "public",
                        "table_name": i.name,
                        "column_name": col,
                        "ordinal_position": n,
                        "is_nullable": "NO" if col == "key" else "YES",
                        "data_type": t.name,
                    }
                )
        return COLUMNS_COLUMNS, rows
    if name in ("schemata", "views", "routines", "key_column_usage"):
        raise unsupported(f"information_schema.{name}")
    raise SqlError("42P01", f'relation "information_schema.{name}" does not exist')


def answer(tree: exp.Select, name: str, tables: Tables) -> Rows:
    columns, rows = _relations(name, tables)
    types = dict(columns)
    where = tree.args.get("where")
    if where is not None:
        rows = [r for r in rows if _truth(_eval(where.this, r))]
    order = tree.args.get("order")
    if order is not None:
        for o in reversed(order.expressions):
            col = o.this
            if not isinstance(col, exp.Column) or col.name not in types:
                raise unsupported(f"ORDER BY {o.sql('postgres')}")
            rows.sort(
                key=lambda r, c=col.name: (r[c] is None, r[c]), reverse=bool(o.args.get("desc"))
            )
    limit = tree.args.get("limit")
    if limit is not None:
        n = _eval(limit.expression or limit.this, {})
        if not isinstance(n, int):
            raise unsupported("LIMIT other than a number here")
        rows = rows[:n]
    outputs: list[tuple[str, PgType]] = []
    getters: list[Any] = []
    for e in tree.expressions:
        alias = e.alias if isinstance(e, exp.Alias) else None
        inner = e.this if isinstance(e, exp.Alias) else e
        if isinstance(inner, exp.Star):
            outputs.extend(columns)
            getters.extend((lambda r, c=c: r[c]) for c, _ in columns)
        elif isinstance(inner, exp.Column):
            if inner.name not in types:
                raise SqlError("42703", f'column "{inner.name}" does not exist')
            outputs.append((alias or inner.name, types[inner.name]))
            getters.append(lambda r, c=inner.name: r[c])
        else:
            raise unsupported(f"{inner.sql('postgres')} in a SELECT from information_schema")
    return Rows(tuple(outputs), tuple(tuple(g(r) for g in getters) for r in rows))


def _truth(v: Any) -> bool:
    return v is True


def _eval(e: exp.Expression, row: dict[str, Any]) -> Any:
    if isinstance(e, exp.Paren):
        return _eval(e.this, row)
    if isinstance(e, exp.Column):
        return row.get(e.name)
    if isinstance(e, exp.Literal):
        return str(e.this) if e.is_string else int(str(e.this))
    if isinstance(e, exp.Null):
        return None
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, exp.And):
        return _truth(_eval(e.this, row)) and _truth(_eval(e.expression, row))
    if isinstance(e, exp.Or):
        return _truth(_eval(e.this, row)) or _truth(_eval(e.expression, row))
    if isinstance(e, exp.Not):
        return not _truth(_eval(e.this, row))
    if isinstance(e, exp.Is):
        return _eval(e.this, row) is None
    if isinstance(e, exp.In):
        v = _eval(e.this, row)
        return any(v == _eval(x, row) for x in e.expressions)
    if isinstance(e, exp.Like | exp.ILike):
        v, p = _eval(e.this, row), _eval(e.expression, row)
        if v is None or p is None:
            return None
        return _like(str(v), str(p), isinstance(e, exp.ILike))
    comparisons = {
        exp.EQ: lambda a, b: a == b,
        exp.NEQ: lambda a, b: a != b,
        exp.GT: lambda a, b: a > b,
        exp.GTE: lambda a, b: a >= b,
        exp.LT: lambda a, b: a < b,
        exp.LTE: lambda a, b: a <= b,
    }
    for kind, op in comparisons.items():
        if isinstance(e, kind):
            a, b = _eval(e.this, row), _eval(e.expression, row)
            return None if a is None or b is None else op(a, b)
    raise unsupported(f"{e.sql('postgres')} in a WHERE over information_schema")


def _like(text: str, pattern: str, fold: bool) -> bool:
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.S | (re.I if fold else 0)) is not None
