"""What SQL sees of the node: its tables as relations, answers made of rows, and the
errors a statement can end in (each with its SQLSTATE)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tablecast.contract.table_info import TableInfo
from tablecast.pg.types import INT4, INT8, JSONB, TEXT, TIMESTAMPTZ, PgType

#: the one database and role a node answers as (current_database(), current_user, the
#: catalog's owner)
DATABASE = ROLE = "tablecast"
SERVER_VERSION = "15.0"
VERSION = f"PostgreSQL {SERVER_VERSION} (tablecast, read-only)"

#: what a session reports (ParameterStatus) and SHOW answers before any SET
DEFAULT_SETTINGS = {
    "server_version": SERVER_VERSION,
    "server_encoding": "UTF8",
    "client_encoding": "UTF8",
    "datestyle": "ISO, MDY",
    "timezone": "UTC",
    "integer_datetimes": "on",
    "standard_conforming_strings": "on",
    "application_name": "",
    "search_path": "public",
    "transaction_isolation": "read committed",
    "default_transaction_read_only": "on",
    "transaction_read_only": "on",
    "is_superuser": "off",
    "intervalstyle": "postgres",
    "extra_float_digits": "1",
    "max_identifier_length": "63",
    "max_index_keys": "32",
    "lc_collate": "C",
}
#: the settings a session reports as it starts (ParameterStatus), spelt as PostgreSQL does
STARTUP_REPORTED = (
    "server_version",
    "server_encoding",
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "integer_datetimes",
    "standard_conforming_strings",
    "application_name",
    "is_superuser",
    "default_transaction_read_only",
    "IntervalStyle",
)


class SqlError(Exception):
    """What a statement cannot be: its SQLSTATE and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def unsupported(what: str) -> SqlError:
    return SqlError("0A000", f"not supported: {what}")


@dataclass(frozen=True)
class Rows:
    """A SELECT answered without a table: constants and the catalog."""

    outputs: tuple[tuple[str, PgType], ...]
    rows: tuple[tuple[Any, ...], ...]
    tag: str = "SELECT"


class Tables:
    """What planning needs: a table by name (SqlError 42P01 when there is none), and every
    table's description (the catalog)."""

    def __init__(
        self, lookup: Callable[[str], TableInfo], listing: Callable[[], list[TableInfo]]
    ) -> None:
        self.lookup = lookup
        self.listing = listing


def table_columns(info: TableInfo) -> list[tuple[str, PgType]]:
    key = INT8 if info.key["format"] == "long" else TEXT
    return [
        ("key", key),
        ("value", JSONB),
        ("partition", INT4),
        ("offset", INT8),
        ("timestamp", TIMESTAMPTZ),
    ]
