"""``pg_catalog``: the system tables psql and JDBC tools read to list tables and columns
(psql's ``\\dt`` and ``\\d t``), filled from the node's tables.

A query over them is run by sqlglot's own Python executor on a handful of
in-memory relations — ``pg_class``, ``pg_namespace``, ``pg_attribute``,
``pg_type``, ``pg_index``, ``pg_constraint``, ``pg_am``, ``pg_attrdef``,
``pg_description``, the database, role and settings views —
after a few rewrites of PostgreSQL's own spellings it does not know
(``pg_catalog.f(...)``, ``OPERATOR(pg_catalog.~)``, ``COLLATE``, casts to
``regclass``, ordinal ORDER BY, ``row_number()`` over attribute numbers).
A query that reads other system tables (policies, publications, statistics …)
or that the executor cannot run answers no rows, with its columns named: what
psql shows for a table that has none of those. Object ids are kept as text, so
``c.oid = '16385'`` compares as PostgreSQL's clients write it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from sqlglot import exp
from sqlglot.executor import execute
from sqlglot.executor.env import ENV
from sqlglot.executor.table import Table

from tablecast.pg.relations import (
    DATABASE,
    DEFAULT_SETTINGS,
    ROLE,
    STARTUP_REPORTED,
    Rows,
    Tables,
    table_columns,
)
from tablecast.pg.types import BOOL, INT8, TEXT, PgType

log = logging.getLogger(__name__)

NAMESPACE_OID = "2200"  # public, as in every PostgreSQL
CATALOG_NAMESPACE_OID = "11"
OWNER_OID = "10"
DATABASE_OID = "16383"
FIRST_TABLE_OID = 16384

#: system tables answered from the node's tables (others: no rows)
KNOWN = (
    "pg_class",
    "pg_namespace",
    "pg_attribute",
    "pg_type",
    "pg_index",
    "pg_am",
    "pg_description",
    "pg_attrdef",
    "pg_constraint",
    "pg_database",
    "pg_roles",
    "pg_user",
    "pg_tables",
    "pg_views",
    "pg_matviews",
    "pg_auth_members",
    "pg_settings",
)
#: system tables that never have a row here (one role, a member of none)
ALWAYS_EMPTY = frozenset({"pg_auth_members"})

_TYPE_NAMES = {
    "25": "text",
    "20": "bigint",
    "23": "integer",
    "3802": "jsonb",
    "1184": "timestamp with time zone",
}


def _register_functions() -> None:
    """PostgreSQL's catalog functions, for the executor (by the names it looks up)."""
    functions: dict[str, Any] = {
        "pg_get_userbyid": lambda oid: ROLE,
        "pg_table_is_visible": lambda oid: True,
        "format_type": lambda oid, mod=None: _TYPE_NAMES.get(str(oid), "text"),
        "pg_get_expr": lambda *a: None,
        "pg_get_indexdef": lambda *a: None,
        "pg_get_constraintdef": lambda *a: None,
        "obj_description": lambda *a: None,
        "col_description": lambda *a: None,
        "pg_encoding_to_char": lambda *a: "UTF8",
        "array_to_string": lambda a, sep, *null: None if a is None else sep.join(map(str, a)),
        "regexplike": lambda s, p: None if s is None or p is None else re.search(p, s) is not None,
        "nullif": lambda a, b: None if a == b else a,
        "currentdatabase": lambda: DATABASE,
        "currentuser": lambda: ROLE,
        "currentschema": lambda: "public",
    }
    for name, fn in functions.items():
        ENV.setdefault(name, fn)
        ENV.setdefault(name.upper(), fn)


_register_functions()


def reads_catalog(tree: exp.Expression) -> bool:
    """Whether a statement reads PostgreSQL's system tables."""
    for t in tree.find_all(exp.Table):
        db = t.db.lower() if t.db else ""
        if db == "pg_catalog" or (not db and t.name.lower().startswith("pg_")):
            return True
    return False


def answer(tree: exp.Expression, tables: Tables) -> Rows:
    """The rows of a SELECT over the system tables (a UNION of them: none)."""
    if not isinstance(tree, exp.Select):
        first = tree.find(exp.Select)
        names = [_column_name(e, i) for i, e in enumerate(first.expressions if first else [])]
        return Rows(tuple((n, TEXT) for n in names), ())
    names = [_column_name(e, i) for i, e in enumerate(tree.expressions)]
    rewritten = _rewritten(tree)
    read = {t.name.lower() for t in rewritten.find_all(exp.Table)}
    if read - set(KNOWN):
        return Rows(tuple((n, TEXT) for n in names), ())
    try:
        relations = {name: _table(name, rows) for name, rows in _relations(tables).items()}
        schema = {name: _schema(t) for name, t in relations.items()}
        result = execute(rewritten, schema={"pg_catalog": schema}, tables={"pg_catalog": relations})
    except Exception as e:  # the executor's reach is limited: what it cannot run has no rows
        log.debug("a catalog query the executor cannot run: %s", e)
        return Rows(tuple((n, TEXT) for n in names), ())
    rows = [tuple(r) for r in result.rows]
    if len(names) != len(result.columns):  # SELECT *: the executor's names
        names = list(result.columns)
    types = [_type_of([r[i] for r in rows]) for i in range(len(names))]
    out = tuple(tuple(_value(v, types[i]) for i, v in enumerate(r)) for r in rows)
    return Rows(tuple(zip(names, types, strict=True)), out)


def column_names(select: exp.Select | None) -> tuple[str, ...]:
    """The names of a SELECT's columns, as PostgreSQL gives them."""
    if select is None:
        return ()
    return tuple(_column_name(e, i) for i, e in enumerate(select.expressions))


def _column_name(e: exp.Expression, i: int) -> str:
    if isinstance(e, exp.Alias):
        return e.alias
    if isinstance(e, exp.Column):
        return e.name
    if isinstance(e, exp.Dot) and isinstance(e.expression, exp.Anonymous):
        return str(e.expression.this).lower()
    if isinstance(e, exp.Anonymous):
        return str(e.this).lower()
    return "?column?"


def _type_of(values: list[Any]) -> PgType:
    seen = [v for v in values if v is not None]
    if seen and all(isinstance(v, bool) for v in seen):
        return BOOL
    if seen and all(isinstance(v, int) and not isinstance(v, bool) for v in seen):
        return INT8
    return TEXT


def _value(v: Any, t: PgType) -> Any:
    if v is None or t is not TEXT or isinstance(v, str):
        return v
    return "t" if v is True else "f" if v is False else str(v)


def _rewritten(tree: exp.Select) -> exp.Expression:
    """The statement in what sqlglot's executor runs."""
    tree = tree.copy()
    _expanded_keys(tree)
    for node in list(tree.find_all(exp.Dot)):
        # pg_catalog.f(...) -> f(...)
        if isinstance(node.this, exp.Identifier) and isinstance(node.expression, exp.Func):
            node.replace(node.expression)
    for node in list(tree.find_all(exp.Collate)):
        node.replace(node.this)
    for node in list(tree.find_all(exp.Operator)):
        op = str(node.args.get("operator", "")).rsplit(".", 1)[-1]
        if op in ("~", "~*"):
            node.replace(exp.RegexpLike(this=node.this, expression=node.expression))
    for node in list(tree.find_all(exp.Cast)):
        to = node.to.sql("postgres").lower()
        if "reg" in to or to.endswith("text") or "oid" in to:
            node.replace(node.this)  # oids and names are text here already
    for w in list(tree.find_all(exp.Window)):
        # row_number() OVER (… ORDER BY a.attnum): attribute numbers here have no gaps
        order = w.args.get("order")
        if isinstance(w.this, exp.RowNumber) and order is not None and len(order.expressions) == 1:
            w.replace(order.expressions[0].this.copy())
    for node in list(tree.find_all(exp.Array)):
        # ARRAY(SELECT … FROM pg_auth_members …), psql's \\du: an empty array
        if len(node.expressions) == 1 and isinstance(node.expressions[0], exp.Select):
            read = {t.name.lower() for t in node.expressions[0].find_all(exp.Table)}
            if read & ALWAYS_EMPTY:
                node.replace(exp.Literal.string("{}"))
    for e in tree.expressions:
        for sub in list(e.find_all(exp.Subquery)):
            sub.replace(exp.Null())  # correlated lookups of defaults and collations: none
    order = tree.args.get("order")
    if order is not None:
        for o in order.expressions:
            if isinstance(o.this, exp.Literal) and not o.this.is_string:
                i = int(o.this.this) - 1
                if 0 <= i < len(tree.expressions):
                    picked = tree.expressions[i]
                    o.set("this", (picked.this if isinstance(picked, exp.Alias) else picked).copy())
    return tree


def _expanded_keys(tree: exp.Expression) -> None:
    """``information_schema._pg_expandarray(i.indkey)``, which JDBC's getPrimaryKeys and
    getIndexInfo read a key's columns with: every index here is on the key alone (attribute
    1), so the one element it expands to is 1 at position 1 (``.x`` and ``.n``)."""

    def expands(e: exp.Expression) -> bool:
        call = e.expression if isinstance(e, exp.Dot) else e
        return isinstance(call, exp.Anonymous) and str(call.this).lower() == "_pg_expandarray"

    holders = {  # the names a SELECT gives an expansion itself (… AS KEYS)
        a.alias.lower() for a in tree.find_all(exp.Alias) if expands(a.this)
    }
    for node in list(tree.find_all(exp.Dot)):
        inner = node.this.unnest() if isinstance(node.this, exp.Paren) else None
        field = node.expression
        if inner is None or not isinstance(field, exp.Identifier):
            continue
        if field.name.lower() not in ("x", "n"):
            continue
        if expands(inner) or (isinstance(inner, exp.Column) and inner.name.lower() in holders):
            node.replace(exp.Literal.number(1))
    for node in list(tree.find_all(exp.Dot, exp.Anonymous)):
        if expands(node) and node.parent is not None and not isinstance(node.parent, exp.Dot):
            node.replace(exp.Literal.number(1))


def _relations(tables: Tables) -> dict[str, list[dict[str, Any]]]:
    infos = sorted((i for i in tables.listing() if i.kind == "kv"), key=lambda i: i.name)
    pg_class, pg_attribute, pg_index, pg_constraint = [], [], [], []
    for n, info in enumerate(infos):
        oid = str(FIRST_TABLE_OID + 2 * n + 1)
        index_oid = str(FIRST_TABLE_OID + 2 * n + 2)
        pg_class.append(_class(oid, info.name, "r", relhasindex=True))
        pg_class.append(_class(index_oid, f"{info.name}_pkey", "i"))
        for num, (col, t) in enumerate(table_columns(info), 1):
            pg_attribute.append(
                {
                    "attrelid": oid,
                    "attname": col,
                    "atttypid": str(t.oid),
                    "atttypmod": -1,
                    "attnum": num,
                    "attnotnull": col == "key",
                    "attisdropped": False,
                    "atthasdef": False,
                    "attidentity": "",
                    "attgenerated": "",
                    "attcollation": "0",
                    "attlen": t.size,
                }
            )
        pg_index.append(
            {
                "indexrelid": index_oid,
                "indrelid": oid,
                "indisprimary": True,
                "indisunique": True,
                "indisclustered": False,
                "indisvalid": True,
                "indisreplident": False,
                "indkey": "1",
                "indnatts": 1,
                "indnkeyatts": 1,
            }
        )
        pg_constraint.append(  # the key is the primary key
            {
                "oid": str(FIRST_TABLE_OID - 1 - n),
                "conname": f"{info.name}_pkey",
                "connamespace": NAMESPACE_OID,
                "contype": "p",
                "condeferrable": False,
                "condeferred": False,
                "convalidated": True,
                "conrelid": oid,
                "conindid": index_oid,
                "confrelid": "0",
                "conkey": "1",
            }
        )
    namespaces = [
        {"oid": NAMESPACE_OID, "nspname": "public", "nspowner": OWNER_OID},
        {"oid": CATALOG_NAMESPACE_OID, "nspname": "pg_catalog", "nspowner": OWNER_OID},
    ]
    types = [
        {
            "oid": oid,
            "typname": name,
            "typnamespace": CATALOG_NAMESPACE_OID,
            "typtype": "b",
            "typlen": size,
            "typnotnull": False,
            "typtypmod": -1,
            "typbasetype": "0",
            "typelem": "0",
            "typrelid": "0",
            "typdelim": ",",
            "typcategory": category,
        }
        for oid, name, size, category in (
            ("25", "text", -1, "S"),
            ("20", "int8", 8, "N"),
            ("23", "int4", 4, "N"),
            ("3802", "jsonb", -1, "U"),
            ("1184", "timestamptz", 8, "D"),
        )
    ]
    return {
        "pg_class": pg_class,
        "pg_namespace": namespaces,
        "pg_attribute": pg_attribute,
        "pg_type": types,
        "pg_index": pg_index,
        "pg_am": [{"oid": "2", "amname": "heap"}, {"oid": "403", "amname": "btree"}],
        "pg_description": [],
        "pg_attrdef": [],
        "pg_constraint": pg_constraint,
        # one database and one role: what a connection sees of a node
        "pg_database": [
            {
                "oid": DATABASE_OID,
                "datname": DATABASE,
                "datdba": OWNER_OID,
                "encoding": 6,
                "datlocprovider": "c",
                "datistemplate": False,
                "datallowconn": True,
                "datconnlimit": -1,
                "datcollate": "C",
                "datctype": "C",
                "daticulocale": None,
                "datacl": None,
            }
        ],
        "pg_roles": [{**_role(), "oid": OWNER_OID}],
        "pg_user": [{"usename": ROLE, "usesysid": OWNER_OID, "usesuper": False}],
        "pg_tables": [
            {
                "schemaname": "public",
                "tablename": info.name,
                "tableowner": ROLE,
                "tablespace": None,
                "hasindexes": True,
                "hasrules": False,
                "hastriggers": False,
                "rowsecurity": False,
            }
            for info in infos
        ],
        "pg_views": [],
        "pg_matviews": [],
        "pg_auth_members": [],
        "pg_settings": [_setting(name, value) for name, value in DEFAULT_SETTINGS.items()],
    }


#: the settings a session may SET (the others are the server's)
_SESSION_SETTINGS = frozenset(
    {"client_encoding", "datestyle", "timezone", "application_name", "search_path"}
    | {"extra_float_digits", "intervalstyle", "transaction_isolation"}
)
#: how PostgreSQL spells the settings whose names are not all lower case
_SETTING_NAMES = {name.lower(): name for name in STARTUP_REPORTED}


def _setting(name: str, value: str) -> dict[str, Any]:
    """A row of ``pg_settings``: a setting as a session starts with it (SHOW gives what a
    session's SET made of it)."""
    return {
        "name": _SETTING_NAMES.get(name, name),
        "setting": value,
        "unit": None,
        "category": "tablecast",
        "short_desc": "",
        "context": "user" if name in _SESSION_SETTINGS else "internal",
        "vartype": "string",
        "source": "default",
        "boot_val": value,
        "reset_val": value,
    }


def _role() -> dict[str, Any]:
    return {
        "rolname": ROLE,
        "rolsuper": False,
        "rolinherit": True,
        "rolcreaterole": False,
        "rolcreatedb": False,
        "rolcanlogin": True,
        "rolreplication": False,
        "rolconnlimit": -1,
        "rolvaliduntil": None,
        "rolbypassrls": False,
    }


#: the columns of relations that may have no rows (the executor learns others from a row)
EMPTY_COLUMNS = {
    "pg_description": ("objoid", "classoid", "objsubid", "description"),
    "pg_attrdef": ("oid", "adrelid", "adnum", "adbin"),
    "pg_constraint": ("oid", "conname", "connamespace", "contype", "conrelid", "conindid"),
    "pg_tables": ("schemaname", "tablename", "tableowner", "tablespace", "hasindexes"),
    "pg_views": ("schemaname", "viewname", "viewowner", "definition"),
    "pg_matviews": ("schemaname", "matviewname", "matviewowner", "ispopulated", "definition"),
    "pg_auth_members": ("oid", "roleid", "member", "grantor", "admin_option"),
}


def _table(name: str, rows: list[dict[str, Any]]) -> Table:
    columns = tuple(rows[0]) if rows else EMPTY_COLUMNS.get(name, ())
    return Table(columns=columns, rows=[tuple(r[c] for c in columns) for r in rows])


def _schema(table: Table) -> dict[str, str]:
    """Each column's SQL type, from its first value (text for a relation with no rows)."""
    first = table.rows[0] if table.rows else (None,) * len(table.columns)
    return {c: _sql_type(v) for c, v in zip(table.columns, first, strict=True)}


def _sql_type(v: Any) -> str:
    if isinstance(v, bool):
        return "BOOLEAN"
    if isinstance(v, int):
        return "BIGINT"
    return "VARCHAR"


def _class(oid: str, name: str, kind: str, relhasindex: bool = False) -> dict[str, Any]:
    return {
        "oid": oid,
        "relname": name,
        "relnamespace": NAMESPACE_OID,
        "relkind": kind,
        "relowner": OWNER_OID,
        "relam": "2" if kind == "r" else "403",
        "relchecks": 0,
        "relhasindex": relhasindex,
        "relhasrules": False,
        "relhastriggers": False,
        "relrowsecurity": False,
        "relforcerowsecurity": False,
        "relispartition": False,
        "reltablespace": "0",
        "reloftype": 0,
        "relpersistence": "p",
        "relreplident": "d",
        "reltoastrelid": "0",
        "relpartbound": None,
    }
