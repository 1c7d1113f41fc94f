"""SQL, as PostgreSQL clients send it, made into statements a session runs: reads of a
table, settings, and the few constant answers drivers ask for when they connect.

sqlglot parses (PostgreSQL's dialect); this module only walks its tree. A table
is a relation with columns ``key``, ``value``, ``partition``, ``offset`` and
``timestamp``. A read's WHERE is on ``key`` alone and picks how the table is
read — one key, a list of keys, a range, a prefix, or every row — and every row
read is also checked against the whole WHERE, so the access path decides speed,
never the answer. ``$n`` parameters are kept as :class:`Param` until Bind.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import sqlglot
from sqlglot import exp

from tablecast.contract.table_info import TableInfo
from tablecast.pg import information_schema, pg_catalog
from tablecast.pg.relations import (
    DATABASE,
    DEFAULT_SETTINGS,
    ROLE,
    VERSION,
    Rows,
    SqlError,
    Tables,
    table_columns,
    unsupported,
)
from tablecast.pg.types import (
    BOOL,
    CASTS,
    INT4,
    INT8,
    JSONB,
    TEXT,
    TIMESTAMPTZ,
    PgType,
    cast,
    plain,
)
from tablecast.query.errors import ApiError
from tablecast.query.fanout import prefix_bytes
from tablecast.query.params import time_param
from tablecast.serde import SerdeError

# sqlglot warns for each statement it keeps as a Command (SHOW): those are expected here
logging.getLogger("sqlglot").setLevel(logging.ERROR)

#: schemas a table may be named in
SCHEMAS = ("public", "tablecast")


@dataclass(frozen=True)
class Param:
    """``$n`` (1-based), whose value comes at Bind."""

    n: int


Value = Any  # a literal's value, or a Param


def resolve(v: Value, params: Sequence[Any]) -> Any:
    if isinstance(v, Param):
        if v.n > len(params):
            raise SqlError("08P01", f"there is no parameter ${v.n}")
        return params[v.n - 1]
    return v


# -- what a row of a table is -------------------------------------------------------------
Row = dict[str, Any]  # key, value, partition, offset, timestamp (JSON values; None unknown)


@dataclass(frozen=True)
class Output:
    """One column of a result: its name, its type, and how a row gives its value."""

    name: str
    type: PgType
    of: Callable[[Row], Any]


# -- statements ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyFilter:
    """The WHERE of a read: how the table is read, and the check every row passes."""

    #: "all", "key", "keys", "range" or "prefix"
    path: str = "all"
    keys: tuple[Value, ...] = ()
    #: range bounds: (value, inclusive) or None
    low: tuple[Value, bool] | None = None
    high: tuple[Value, bool] | None = None
    prefix: Value | None = None
    #: the whole WHERE, for the check of every row
    where: exp.Expression | None = None


@dataclass(frozen=True)
class Read:
    """A SELECT from one table."""

    table: str
    info: TableInfo
    outputs: tuple[Output, ...]
    count: bool
    filter: KeyFilter
    limit: Value | None = None
    offset: Value | None = None
    params: int = 0
    #: the type each parameter is read as (its position: 1-based)
    param_types: dict[int, PgType] = field(default_factory=dict)
    #: whether it names a record's partition, offset or timestamp (or all columns)
    metadata: bool = False


#: the columns a read of a record gives beside its key and value
RECORD_COLUMNS = frozenset({"partition", "offset", "timestamp"})


@dataclass(frozen=True)
class TimeBounds:
    """A WHERE on a function's time column: comparisons with values (``$n``, epoch
    milliseconds or timestamps), joined by AND."""

    terms: tuple[tuple[str, Value], ...] = ()

    def resolve(self, params: Sequence[Any]) -> tuple[int | None, int | None]:
        """The times allowed, as inclusive epoch milliseconds (None: unbounded)."""
        low: int | None = None
        high: int | None = None
        for op, v in self.terms:
            ms = time_ms(resolve(v, params))
            if op in (">", ">=", "="):
                at = ms + 1 if op == ">" else ms
                low = at if low is None else max(low, at)
            if op in ("<", "<=", "="):
                at = ms - 1 if op == "<" else ms
                high = at if high is None else min(high, at)
        return low, high


def time_ms(v: Any) -> int:
    """A time as epoch milliseconds: a number is one already, text is one or a timestamp
    (UTC unless it names its zone), as HTTP's time parameters take them."""
    if isinstance(v, dt.datetime):
        v = v.isoformat()
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if not isinstance(v, str):
        raise SqlError("22023", f"a time is a timestamp or epoch milliseconds, not {v!r}")
    try:
        return int(time_param({"time": v}, "time", None))
    except ApiError:
        raise SqlError("22007", f'invalid input syntax for type timestamp: "{v}"') from None


@dataclass(frozen=True)
class Function:
    """A table function of schema ``tablecast``: its arguments after the table's name, its
    columns, the kind of table it reads, its time column (WHERE bounds it) and the columns
    ORDER BY may name (the first alone may be DESC)."""

    args: tuple[str, ...]
    columns: tuple[str, ...]
    kind: str = "kv"
    time: str | None = None
    order: tuple[str, ...] = ()


#: the types of the table functions' columns (``key``'s is the table's)
COLUMN_TYPES = {
    "value": JSONB,
    "timestamp": TIMESTAMPTZ,
    "offset": INT8,
    "index_value": TEXT,
    "window_start": TIMESTAMPTZ,
    "window_end": TIMESTAMPTZ,
}
FUNCTIONS = {
    # a key's versions
    "history": Function(
        ("key",), ("key", "value", "timestamp", "offset"), "kv", "timestamp", ("timestamp",)
    ),
    # the rows whose index value is the one given
    "index": Function(("index", "value"), ("key", "value"), order=("key",)),
    # the rows whose index value is in [from, to) (NULL: open), by value then key
    "index_range": Function(
        ("index", "from", "to"), ("index_value", "key", "value"), order=("index_value", "key")
    ),
    # a window or session table's windows of a key
    "windows": Function(
        ("key",),
        ("key", "window_start", "window_end", "value"),
        "window",
        "window_start",
        ("window_start",),
    ),
}


@dataclass(frozen=True)
class FunctionRead:
    """A table function (:data:`FUNCTIONS`) as a relation: ``tablecast.history(table,
    key)``, ``tablecast.index(table, index, value)``, ``tablecast.index_range(table,
    index, from, to)`` or ``tablecast.windows(table, key)``."""

    kind: str
    info: TableInfo
    args: tuple[Value, ...]
    outputs: tuple[Output, ...]
    newest_first: bool = False
    limit: Value | None = None
    offset: Value | None = None
    params: int = 0
    times: TimeBounds = TimeBounds()
    param_types: dict[int, PgType] = field(default_factory=dict)


@dataclass(frozen=True)
class CatalogQuery:
    """A query over the system tables with ``$n`` parameters: answered once they are bound
    (:meth:`bound`)."""

    tree: exp.Expression
    params: int
    names: tuple[str, ...]

    def bound(self, params: Sequence[Any], tables: Tables) -> Rows:
        tree = self.tree.copy()
        for p in list(tree.find_all(exp.Parameter)):
            v = resolve(_literal(p), params)
            if v is None:
                p.replace(exp.Null())
            elif isinstance(v, bool):
                p.replace(exp.Boolean(this=v))
            elif isinstance(v, int | float):
                p.replace(exp.Literal.number(v))
            else:
                p.replace(exp.Literal.string(str(v)))
        return pg_catalog.answer(tree, tables)


@dataclass(frozen=True)
class Subscribe:
    """``COPY (SUBSCRIBE TO t [WHERE …] [SINCE 'position'] [WITH (SNAPSHOT = false)]) TO
    STDOUT``: the table's rows, then every change, as the watch of the HTTP API streams
    them; from a position (a row's second column) on, the changes after it alone."""

    table: str
    keys: tuple[Value, ...] | None = None
    prefix: str | None = None
    start: Value | None = None
    end: Value | None = None
    since: Value | None = None
    snapshot: bool = True
    params: int = 0


#: the live form, found before the parser (sqlglot reads no SUBSCRIBE)
_SUBSCRIBE = re.compile(
    r'^\s*COPY\s*\(\s*SUBSCRIBE\s+(?:TO\s+)?(?P<table>"[^"]+"|[\w.-]+)'
    r"\s*(?:WHERE\s+(?P<where>.*?))?"
    r"(?:\s*\bSINCE\s+(?P<since>'(?:[^']|'')*'|\$\d+))?"
    r"(?:\s*\bWITH\s*\(\s*SNAPSHOT\s*=?\s*(?P<snapshot>true|false)\s*\))?"
    r"\s*\)\s*TO\s+STDOUT\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)


def _subscribe(sql: str, tables: Tables) -> Subscribe | None:
    """The live form's statement, or None when `sql` is not one."""
    m = _SUBSCRIBE.match(sql)
    if m is None:
        return None
    table = m["table"].strip('"')
    if table.lower().startswith(("public.", "tablecast.")):
        table = table.split(".", 1)[1]
    since = None if m["since"] is None else _literal(sqlglot.parse_one(m["since"], read="postgres"))
    snapshot = (m["snapshot"] or "true").lower() == "true"
    params = since.n if isinstance(since, Param) else 0
    if m["where"] is None:
        tables.lookup(table)
        return Subscribe(table, since=since, snapshot=snapshot, params=params)
    read = _select(
        sqlglot.parse_one(f'SELECT * FROM "{table}" WHERE {m["where"]}', read="postgres"), tables
    )  # type: ignore[arg-type]
    assert isinstance(read, Read)
    f = read.filter
    resumed = {"since": since, "snapshot": snapshot, "params": max(params, read.params)}
    if f.path in ("key", "keys"):
        return Subscribe(table, keys=f.keys, **resumed)
    if f.path == "prefix" and f.low is None and f.high is None and isinstance(f.prefix, str):
        return Subscribe(table, prefix=f.prefix[:-1], **resumed)
    if f.path == "range" and (f.low is None or f.low[1]) and (f.high is None or not f.high[1]):
        return Subscribe(
            table,
            start=None if f.low is None else f.low[0],
            end=None if f.high is None else f.high[0],
            **resumed,
        )
    raise unsupported(
        "SUBSCRIBE … WHERE other than key = v, key IN (…), key LIKE 'p%', key >= a AND key < b"
    )


@dataclass(frozen=True)
class Setting:
    """``SET name = value`` (``value`` None: ``RESET`` / ``SET name TO DEFAULT``)."""

    name: str
    value: Value | None


@dataclass(frozen=True)
class Sleep:
    """``SELECT pg_sleep(s)``: a statement that only waits (what a cancel is tried with)."""

    seconds: Value
    params: int = 0


#: the longest pg_sleep a session waits
MAX_SLEEP_S = 60.0


def sleep_seconds(v: Any) -> float:
    """pg_sleep's argument as the seconds to wait (at most :data:`MAX_SLEEP_S`)."""
    try:
        seconds = float(v)
    except (TypeError, ValueError):
        raise SqlError("22023", "pg_sleep takes a number of seconds") from None
    if isinstance(v, bool) or seconds != seconds:
        raise SqlError("22023", "pg_sleep takes a number of seconds")
    return min(max(seconds, 0.0), MAX_SLEEP_S)


@dataclass(frozen=True)
class Show:
    name: str


@dataclass(frozen=True)
class Nothing:
    """A statement with no rows and nothing to do (BEGIN, COMMIT, DISCARD ...): its tag."""

    tag: str


Statement = Read | FunctionRead | Rows | Setting | Show | Nothing | Sleep | Subscribe | CatalogQuery


#: the longest SQL text parsed: a statement here is a line or two, and parsing costs the
#: node's event loop in proportion to its length
MAX_SQL = 64 * 1024


def parse(sql: str, tables: Tables) -> list[Statement]:
    """The statements of a query string (an empty one: none)."""
    if len(sql) > MAX_SQL:
        raise SqlError("54000", f"a statement of more than {MAX_SQL} characters")
    if not sql.strip().strip(";").strip():
        return []
    try:
        live = _subscribe(sql, tables)
        if live is not None:
            return [live]
        trees = sqlglot.parse(sql, read="postgres")
        return [plan(t, tables) for t in trees if t is not None]
    except sqlglot.errors.ParseError as e:
        first = e.errors[0]["description"] if e.errors else str(e)
        raise SqlError("42601", f"syntax error: {first}") from None
    except sqlglot.errors.SqlglotError as e:
        raise SqlError("42601", f"syntax error: {e}") from None
    except RecursionError:
        raise SqlError("54001", "statement too complex (nested too deep)") from None


def plan(tree: exp.Expression, tables: Tables) -> Statement:
    if isinstance(tree, exp.Union) and pg_catalog.reads_catalog(tree):
        return _catalog(tree, tables)
    if isinstance(tree, exp.Select):
        return _select(tree, tables)
    if isinstance(tree, exp.Set):
        return _set(tree)
    if isinstance(tree, exp.Command):
        return _command(tree)
    if isinstance(tree, exp.Transaction):
        return Nothing("BEGIN")
    if isinstance(tree, exp.Commit):
        return Nothing("COMMIT")
    if isinstance(tree, exp.Rollback):
        return Nothing("ROLLBACK")
    if isinstance(
        tree,
        exp.Insert | exp.Update | exp.Delete | exp.Create | exp.Drop | exp.Alter | exp.Merge,
    ):
        raise SqlError("25006", "cannot execute a write: tablecast tables are read-only")
    raise unsupported(f"{tree.key.upper()} statements")


def _command(tree: exp.Command) -> Statement:
    name = str(tree.this).upper()
    arg = tree.expression.this if isinstance(tree.expression, exp.Literal) else ""
    if name == "SHOW":
        return Show(str(arg).strip().lower())
    if name == "RESET":
        return Setting(str(arg).strip().lower(), None)
    if name in ("DISCARD", "DEALLOCATE", "CLOSE"):
        return Nothing(name)
    if name in ("START", "END"):
        return Nothing("BEGIN" if name == "START" else "COMMIT")
    if name in ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "COPY", "GRANT", "REVOKE"):
        raise SqlError("25006", "cannot execute a write: tablecast tables are read-only")
    raise unsupported(f"{name} statements")


def _set(tree: exp.Set) -> Statement:
    if len(tree.expressions) != 1:
        raise unsupported("SET of more than one setting")
    item = tree.expressions[0]
    eq = item.this if isinstance(item, exp.SetItem) else item
    if not isinstance(eq, exp.EQ):
        raise unsupported(f"SET {eq.sql('postgres')}")
    target = eq.this
    name = target.sql("postgres").replace('"', "").lower()
    rhs = eq.expression
    if isinstance(rhs, exp.Var) and rhs.name.upper() == "DEFAULT":
        return Setting(name, None)
    return Setting(name, _literal(rhs, setting=True))


# -- SELECT -------------------------------------------------------------------------------------
def _catalog(tree: exp.Expression, tables: Tables) -> Rows | CatalogQuery:
    params = max((_param_number(p) for p in tree.find_all(exp.Parameter)), default=0)
    if params:
        first = tree if isinstance(tree, exp.Select) else tree.find(exp.Select)
        names = pg_catalog.column_names(first)
        return CatalogQuery(tree, params, names)
    return pg_catalog.answer(tree, tables)


def _select(tree: exp.Select, tables: Tables) -> Statement:
    if pg_catalog.reads_catalog(tree):
        return _catalog(tree, tables)
    for part in ("joins", "group", "having", "windows", "distinct", "qualify", "with_"):
        if tree.args.get(part):
            raise unsupported(f"{part.rstrip('_').upper()} in a SELECT")
    source = tree.args.get("from_") or tree.args.get("from")
    if source is None:
        return _constants(tree)
    relation = source.this
    if not isinstance(relation, exp.Table):
        raise unsupported("a SELECT from anything but a table")
    if isinstance(relation.this, exp.Anonymous):
        return _function_read(tree, relation, tables)
    schema = relation.db.lower() if relation.db else None
    name = relation.name
    if schema == "information_schema":
        return information_schema.answer(tree, name.lower(), tables)
    if schema is not None and schema not in SCHEMAS:
        raise SqlError("42P01", f'relation "{schema}.{name}" does not exist')
    info = tables.lookup(name)
    if info.kind != "kv":
        windows = f"tablecast.windows('{name}', key)"
        raise unsupported(f"SELECT from window table {name!r}: read it with {windows}")
    columns = dict(table_columns(info))
    param_types: dict[int, PgType] = {}
    count = False
    outputs: list[Output] = []
    for e in tree.expressions:
        alias = e.alias if isinstance(e, exp.Alias) else None
        inner = e.this if isinstance(e, exp.Alias) else e
        if isinstance(inner, exp.Count):
            if len(tree.expressions) != 1 or not isinstance(inner.this, exp.Star):
                raise unsupported("count() other than a lone count(*)")
            count = True
            outputs.append(Output(alias or "count", INT8, lambda r: 0))
            continue
        if isinstance(inner, exp.Star):
            outputs.extend(Output(c, t, _field(c)) for c, t in columns.items())
            continue
        outputs.append(_output(inner, alias, columns))
    where = tree.args.get("where")
    key_filter = _filter(where.this if where else None, info, param_types)
    order = tree.args.get("order")
    if order is not None:
        for o in order.expressions:
            col = o.this
            if not (isinstance(col, exp.Column) and col.name == "key") or o.args.get("desc"):
                raise unsupported(f"ORDER BY {o.sql('postgres')} (rows come by key, ascending)")
    limit = _count_clause(tree.args.get("limit"), param_types)
    offset = _count_clause(tree.args.get("offset"), param_types)
    params = max((_param_number(p) for p in tree.find_all(exp.Parameter)), default=0)
    for n in range(1, params + 1):
        param_types.setdefault(n, TEXT)
    metadata = any(isinstance(e, exp.Star) for e in tree.expressions) or any(
        c.name in RECORD_COLUMNS for c in tree.find_all(exp.Column)
    )
    return Read(
        name,
        info,
        tuple(outputs),
        count,
        key_filter,
        limit,
        offset,
        params,
        param_types,
        metadata,
    )


def _function_read(tree: exp.Select, relation: exp.Table, tables: Tables) -> FunctionRead:
    """``SELECT … FROM tablecast.<function>('t', …) [WHERE <time bounds>] [ORDER BY …]``."""
    call = relation.this
    kind = str(call.this).lower()
    schema = relation.db.lower() if relation.db else "tablecast"
    function = FUNCTIONS.get(kind)
    if schema != "tablecast" or function is None:
        raise SqlError("42883", f"function {relation.sql('postgres')} does not exist")
    wanted = 1 + len(function.args)
    if len(call.expressions) != wanted:
        names = ", ".join(("table", *function.args))
        raise SqlError("42883", f"tablecast.{kind} takes {wanted} arguments ({names})")
    table = _literal(call.expressions[0])
    if not isinstance(table, str):
        raise SqlError("22023", f"tablecast.{kind}'s first argument is a table name")
    info = tables.lookup(table)
    if info.kind != function.kind:
        what = "a window or session table" if function.kind == "window" else "a key-value table"
        raise SqlError("42809", f"tablecast.{kind} reads {what}; {table!r} is not one")
    args = tuple(_literal(a) for a in call.expressions[1:])
    for part in ("joins", "group", "having", "distinct", "with_"):
        if tree.args.get(part):
            raise unsupported(f"{part.rstrip('_').upper()} on tablecast.{kind}(...)")
    types = {**COLUMN_TYPES, "key": INT8 if info.key["format"] == "long" else TEXT}
    columns = {n: types[n] for n in function.columns}
    outputs: list[Output] = []
    for e in tree.expressions:
        alias = e.alias if isinstance(e, exp.Alias) else None
        inner = e.this if isinstance(e, exp.Alias) else e
        if isinstance(inner, exp.Star):
            outputs.extend(Output(c, t, _field(c)) for c, t in columns.items())
        else:
            outputs.append(_output(inner, alias, columns))
    newest_first = False
    order = tree.args.get("order")
    for i, o in enumerate(order.expressions if order is not None else ()):
        col = o.this
        name = col.name if isinstance(col, exp.Column) and not col.table else None
        if name not in function.order[i : i + 1] or (o.args.get("desc") and i > 0):
            raise unsupported(f"ORDER BY {o.sql('postgres')} on tablecast.{kind}(...)")
        if o.args.get("desc"):
            if kind != "history":
                raise unsupported(f"ORDER BY {o.sql('postgres')} on tablecast.{kind}(...)")
            newest_first = True
    param_types: dict[int, PgType] = {}
    where = tree.args.get("where")
    times = _time_bounds(where.this, function, kind, param_types) if where else TimeBounds()
    limit = _count_clause(tree.args.get("limit"), param_types)
    offset = _count_clause(tree.args.get("offset"), param_types)
    params = max((_param_number(p) for p in tree.find_all(exp.Parameter)), default=0)
    return FunctionRead(
        kind, info, args, tuple(outputs), newest_first, limit, offset, params, times, param_types
    )


_COMPARE = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<=", exp.EQ: "="}
_FLIPPED = {">": "<", ">=": "<=", "<": ">", "<=": ">=", "=": "="}


def _time_bounds(
    where: exp.Expression, function: Function, kind: str, param_types: dict[int, PgType]
) -> TimeBounds:
    """The WHERE of a table function: comparisons of its time column with values."""
    column = function.time
    if column is None:
        raise unsupported(f"WHERE on tablecast.{kind}(...)")
    what = (
        f"WHERE on tablecast.{kind}(...): {column} compared with times (>, >=, <, <=, =,"
        f" BETWEEN), joined by AND; not {where.sql('postgres')}"
    )
    terms: list[tuple[str, Value]] = []

    def value(e: exp.Expression) -> Value:
        v = _literal(e)
        if isinstance(v, Param):
            param_types.setdefault(v.n, TIMESTAMPTZ)
        return v

    def is_time(e: exp.Expression) -> bool:
        return isinstance(e, exp.Column) and e.name == column and not e.table

    for t in where.flatten() if isinstance(where, exp.And) else [where]:
        t = t.unnest()
        if isinstance(t, exp.Between) and is_time(t.this):
            terms += [(">=", value(t.args["low"])), ("<=", value(t.args["high"]))]
            continue
        op = _COMPARE.get(type(t))
        if op is None or not isinstance(t, exp.Binary):
            raise unsupported(what)
        if is_time(t.this) and not isinstance(t.expression, exp.Column):
            terms.append((op, value(t.expression)))
        elif is_time(t.expression) and not isinstance(t.this, exp.Column):
            terms.append((_FLIPPED[op], value(t.this)))
        else:
            raise unsupported(what)
    return TimeBounds(tuple(terms))


def _param_number(p: exp.Parameter) -> int:
    v = _literal(p)
    assert isinstance(v, Param)
    return v.n


def _count_clause(node: exp.Expression | None, param_types: dict[int, PgType]) -> Value | None:
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    if value is None:
        value = node.this
    v = _literal(value)
    if isinstance(v, Param):
        param_types[v.n] = INT8
    elif not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SqlError("22023", f"LIMIT and OFFSET take a non-negative integer, not {v!r}")
    return v


def _field(name: str) -> Callable[[Row], Any]:
    return lambda r: r.get(name)


def _output(e: exp.Expression, alias: str | None, columns: dict[str, PgType]) -> Output:
    if isinstance(e, exp.Column):
        if e.table or e.name not in columns:
            raise SqlError("42703", f'column "{e.sql("postgres")}" does not exist')
        return Output(alias or e.name, columns[e.name], _field(e.name))
    of, t = _expression(e, columns)
    return Output(alias or ("?column?" if not isinstance(e, exp.Cast) else _cast_name(e)), t, of)


def _cast_name(e: exp.Cast) -> str:
    return {"INT8": "int8", "INT4": "int4", "NUMERIC": "numeric"}.get(
        _cast_type(e).name.upper(), _cast_type(e).name
    )


def _cast_type(e: exp.Cast) -> PgType:
    name = e.to.this.name if hasattr(e.to.this, "name") else str(e.to.this)
    t = CASTS.get(name.upper())
    if t is None:
        raise unsupported(f"a cast to {e.to.sql('postgres')}")
    return t


def _expression(
    e: exp.Expression, columns: dict[str, PgType]
) -> tuple[Callable[[Row], Any], PgType]:
    """A select-list expression: how a row gives its value, and the value's type."""
    if isinstance(e, exp.Paren):
        return _expression(e.this, columns)
    if isinstance(e, exp.Column):
        if e.name not in columns or e.table:
            raise SqlError("42703", f'column "{e.sql("postgres")}" does not exist')
        return _field(e.name), columns[e.name]
    if isinstance(e, exp.JSONExtract | exp.JSONExtractScalar):
        base, t = _expression(e.this, columns)
        if t is not JSONB:
            raise SqlError("42883", "operator -> and ->> take a jsonb on their left")
        path = _json_path(e.expression)
        if isinstance(e, exp.JSONExtractScalar):
            return (lambda r: _as_text(_walk(base(r), path))), TEXT
        return (lambda r: _walk(base(r), path)), JSONB
    if isinstance(e, exp.Cast):
        inner, _ = _expression(e.this, columns)
        to = _cast_type(e)
        return (lambda r: cast(inner(r), to)), to
    if isinstance(e, exp.Literal):
        v = _literal(e)
        return (lambda r: v), (TEXT if isinstance(v, str) else INT8)
    raise unsupported(f"{e.sql('postgres')} in the select list")


def _json_path(node: exp.Expression) -> list[str | int]:
    if isinstance(node, exp.JSONPath):
        out: list[str | int] = []
        for part in node.expressions:
            if isinstance(part, exp.JSONPathRoot):
                continue
            if isinstance(part, exp.JSONPathKey):
                out.append(str(part.this))
            elif isinstance(part, exp.JSONPathSubscript):
                out.append(int(part.this))
            else:
                raise unsupported(f"the JSON path {node.sql('postgres')}")
        return out
    if isinstance(node, exp.Literal):
        return [int(node.this)] if not node.is_string else [str(node.this)]
    raise unsupported(f"the JSON path {node.sql('postgres')}")


def _walk(value: Any, path: list[str | int]) -> Any:
    value = plain(value)
    for step in path:
        if isinstance(step, int) and isinstance(value, list):
            value = value[step] if -len(value) <= step < len(value) else None
        elif isinstance(step, str) and isinstance(value, dict):
            value = value.get(step)
        else:
            return None
    return value


def _as_text(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else orjson.dumps(v).decode()


def _literal(e: exp.Expression, setting: bool = False) -> Value:
    if isinstance(e, exp.Parameter):
        n = e.this.this if isinstance(e.this, exp.Literal) else e.name
        try:
            return Param(int(n))
        except (TypeError, ValueError):
            raise SqlError("42601", f"syntax error at {e.sql('postgres')}") from None
    if isinstance(e, exp.Literal):
        if e.is_string:
            return str(e.this)
        text = str(e.this)
        try:
            return int(text)
        except ValueError:
            return float(text)
    if isinstance(e, exp.Neg) and isinstance(e.this, exp.Literal) and not e.this.is_string:
        v = _literal(e.this)
        return -v
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, exp.Null):
        return None
    if setting and isinstance(e, exp.Var | exp.Column | exp.Identifier):
        return e.name
    if isinstance(e, exp.Cast):
        return _literal(e.this, setting)
    raise unsupported(f"{e.sql('postgres')} where a value is expected")


# -- WHERE ----------------------------------------------------------------------------------------
def _filter(
    where: exp.Expression | None, info: TableInfo, param_types: dict[int, PgType]
) -> KeyFilter:
    if where is None:
        return KeyFilter()
    key_type = INT8 if info.key["format"] == "long" else TEXT
    terms = list(where.flatten()) if isinstance(where, exp.And) else [where]
    eq: list[Value] | None = None
    low: tuple[Value, bool] | None = None
    high: tuple[Value, bool] | None = None
    prefix: Value | None = None
    for t in terms:
        _check_predicate(t, param_types, key_type)
        t = t.unnest()
        if isinstance(t, exp.EQ):
            eq = [_key_side(t)[1]]
        elif isinstance(t, exp.In):
            eq = [_literal(v) for v in t.expressions]
        elif isinstance(t, exp.Like):
            prefix = _literal(t.expression)
        elif isinstance(t, exp.GT | exp.GTE | exp.LT | exp.LTE):
            flipped, v = _key_side(t)
            lower = isinstance(t, exp.GT | exp.GTE) != flipped
            inclusive = isinstance(t, exp.GTE | exp.LTE)
            if lower:
                low = (v, inclusive)
            else:
                high = (v, inclusive)
    if eq is not None:
        return KeyFilter("key" if len(eq) == 1 else "keys", tuple(eq), where=where)
    if prefix is not None:
        return KeyFilter("prefix", prefix=prefix, low=low, high=high, where=where)
    if low is not None or high is not None:
        return KeyFilter("range", low=low, high=high, where=where)
    return KeyFilter(where=where)


def _key_side(t: exp.Binary) -> tuple[bool, Value]:
    """(whether the key is on the right, the value on the other side)."""
    if isinstance(t.this, exp.Column):
        return False, _literal(t.expression)
    return True, _literal(t.this)


def _check_predicate(t: exp.Expression, param_types: dict[int, PgType], key_type: PgType) -> None:
    """A term of the WHERE that names the key and values only (else 0A000)."""
    t = t.unnest()
    what = (
        "WHERE on key alone: key = v, key IN (...), key > v (>=, <, <=), key LIKE 'prefix%'"
        f", joined by AND; not {t.sql('postgres')}"
    )
    if isinstance(t, exp.In):
        sides = [t.this, *t.expressions]
        if not isinstance(t.this, exp.Column) or t.args.get("query") or not t.expressions:
            raise unsupported(what)
    elif isinstance(t, exp.Like):
        sides = [t.this, t.expression]
        if not isinstance(t.this, exp.Column):
            raise unsupported(what)
        pattern = _literal(t.expression)
        if isinstance(pattern, str) and not _is_prefix_pattern(pattern):
            raise unsupported(f"LIKE {pattern!r}: only a prefix followed by one % ('abc%')")
    elif isinstance(t, exp.EQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
        sides = [t.this, t.expression]
        if sum(isinstance(s, exp.Column) for s in sides) != 1:
            raise unsupported(what)
    else:
        raise unsupported(what)
    for s in sides:
        if isinstance(s, exp.Column):
            if s.name != "key" or s.table:
                raise unsupported(what)
        else:
            v = _literal(s)
            if isinstance(v, Param):
                param_types.setdefault(v.n, key_type)


def _is_prefix_pattern(p: str) -> bool:
    return p.endswith("%") and not any(c in p[:-1] for c in "%_\\")


#: key formats whose text form is the key itself (a string; bytes as latin-1 text), not JSON
TEXT_KEYS = ("string", "bytes")


def key_json(info: TableInfo, v: Any) -> Any:
    """A value a statement compares the key with, as the table's key in JSON."""
    fmt = info.key["format"]
    if v is None:
        raise SqlError("22004", "a key is never NULL")
    if fmt in TEXT_KEYS:
        return v if isinstance(v, str) else orjson.dumps(v).decode()
    if fmt == "long":
        try:
            return int(v)
        except (TypeError, ValueError):
            raise SqlError("22P02", f"invalid input syntax for type bigint: {v!r}") from None
    if isinstance(v, str):
        try:
            return orjson.loads(v)
        except orjson.JSONDecodeError:
            return v
    return v


def key_raw(info: TableInfo, v: Any) -> bytes:
    """The serialized key a value stands for (22P02 when it cannot be one)."""
    serde = info.key_serde
    try:
        return serde.serialize(serde.from_json(key_json(info, v)))
    except SerdeError as e:
        raise SqlError("22P02", f"not a {serde.format} key: {e}") from None


def key_text(info: TableInfo, v: Any) -> str:
    """A key as a URL path names it (the text reads take)."""
    j = key_json(info, v)
    return j if isinstance(j, str) and info.key["format"] in TEXT_KEYS else orjson.dumps(j).decode()


def _ordered(info: TableInfo, raw: bytes) -> bytes | int:
    """What a key compares as: a bigint key as its number, any other as its bytes."""
    if info.key["format"] == "long":
        return int.from_bytes(raw, "big", signed=True)
    return raw


def row_passes(
    where: exp.Expression | None, raw: bytes, info: TableInfo, params: Sequence[Any]
) -> bool:
    """Whether a row whose serialized key is `raw` meets the WHERE (keys compare as bytes)."""
    if where is None:
        return True
    t = where.unnest()
    if isinstance(t, exp.And):
        return all(row_passes(x, raw, info, params) for x in t.flatten())
    if isinstance(t, exp.EQ):
        return raw == key_raw(info, resolve(_key_side(t)[1], params))
    if isinstance(t, exp.In):
        return any(raw == key_raw(info, resolve(_literal(v), params)) for v in t.expressions)
    if isinstance(t, exp.Like):
        pattern = resolve(_literal(t.expression), params)
        if not isinstance(pattern, str) or not _is_prefix_pattern(pattern):
            raise unsupported(f"LIKE {pattern!r}: only a prefix followed by one % ('abc%')")
        if not pattern[:-1]:
            return True
        try:  # the prefix the range read took: the text's bytes, as HTTP's ?prefix=
            return raw.startswith(prefix_bytes(info, pattern[:-1]))
        except ApiError as e:
            raise unsupported(f"LIKE on {info.key['format']} keys: {e.message}") from None
    if isinstance(t, exp.GT | exp.GTE | exp.LT | exp.LTE):
        flipped, v = _key_side(t)
        mine, bound = _ordered(info, raw), _ordered(info, key_raw(info, resolve(v, params)))
        lower = isinstance(t, exp.GT | exp.GTE) != flipped
        inclusive = isinstance(t, exp.GTE | exp.LTE)
        if lower:
            return mine > bound or (inclusive and mine == bound)
        return mine < bound or (inclusive and mine == bound)
    raise unsupported(t.sql("postgres"))


# -- constants ----------------------------------------------------------------------------------
def _constants(tree: exp.Select) -> Rows | Sleep:
    """A SELECT without FROM: literals and what drivers ask at connect."""
    if len(tree.expressions) == 1:
        e = tree.expressions[0]
        if isinstance(e, exp.Anonymous) and str(e.this).lower() == "pg_sleep":
            seconds = _literal(e.expressions[0]) if len(e.expressions) == 1 else None
            if isinstance(seconds, Param):
                return Sleep(seconds, seconds.n)
            return Sleep(sleep_seconds(seconds))
    outputs: list[tuple[str, PgType]] = []
    row: list[Any] = []
    for e in tree.expressions:
        alias = e.alias if isinstance(e, exp.Alias) else None
        inner = e.this if isinstance(e, exp.Alias) else e
        name, t, v = _constant(inner)
        outputs.append((alias or name, t))
        row.append(v)
    return Rows(tuple(outputs), (tuple(row),))


def _constant(e: exp.Expression) -> tuple[str, PgType, Any]:
    if isinstance(e, exp.CurrentVersion) or (
        isinstance(e, exp.Anonymous) and str(e.this).lower() == "version"
    ):
        return "version", TEXT, VERSION
    if isinstance(e, exp.CurrentSchema):
        return "current_schema", TEXT, "public"
    if isinstance(e, exp.CurrentDatabase):
        return "current_database", TEXT, DATABASE
    if e.sql("postgres").upper() in ("CURRENT_CATALOG", "CURRENT_CATALOG()"):
        return "current_catalog", TEXT, DATABASE
    if isinstance(e, exp.CurrentUser):
        return "current_user", TEXT, ROLE
    if isinstance(e, exp.Anonymous) and str(e.this).lower() == "current_setting":
        name = _literal(e.expressions[0]) if e.expressions else ""
        return "current_setting", TEXT, DEFAULT_SETTINGS.get(str(name).lower())
    if isinstance(e, exp.Literal | exp.Neg | exp.Boolean | exp.Null):
        v = _literal(e)
        t = BOOL if isinstance(v, bool) else TEXT if isinstance(v, str) or v is None else INT4
        return "?column?", t, v
    if isinstance(e, exp.Cast):
        _, _, v = _constant(e.this)
        to = _cast_type(e)
        return _cast_name(e), to, cast(v, to)
    raise unsupported(f"SELECT {e.sql('postgres')} without FROM")
