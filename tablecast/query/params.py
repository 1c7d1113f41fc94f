"""Which query parameters each route takes, and how numbers and times in them are read.

A parameter a route does not know is a mistake the caller should hear about
(a typo such as ``max-lag`` would otherwise be ignored silently), so it is
answered with 400 naming it. The read options every read route takes are
listed once (:data:`READ`) and read by :mod:`tablecast.query.consistency`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from tablecast.query.errors import ApiError

#: options every read takes: who may answer, and how fresh it must be
READ = frozenset({"max_lag", "max_staleness_ms", "min_offset", "after", "timeout_ms", "redirect"})
_KEY = frozenset({"key"})  # the ?key= form of a key route, for any key text
_PAGE = frozenset({"limit", "cursor"})

KNOWN: dict[str, frozenset[str]] = {
    "key": READ | _KEY | {"as_of"},
    "windows": READ | _KEY | {"from", "to"},
    "history": READ | _KEY | _PAGE | {"from", "to", "order"},
    "metadata": _KEY,
    "batch_get": READ,
    "range": READ | _PAGE | {"from", "to", "prefix", "owned", "as_of"},
    "count": READ,
    "index_lookup": READ | _PAGE,
    "index_range": READ | _PAGE | {"from", "to"},
    "internal_scan": READ
    | {"partitions", "start", "end", "limit", "view", "index", "as_of", "value"},
    "internal_count": READ | {"partitions"},
    "internal_snapshot": frozenset({"partitions", "keys", "spans", "at_least"}),
}

#: the largest integer any parameter takes (Kafka offsets and epoch ms are int64)
MAX_INT = 2**63 - 1


def check(route: str, params: Mapping[str, str]) -> None:
    unknown = params.keys() - KNOWN.get(route, frozenset())
    if unknown:
        known = ", ".join(sorted(KNOWN.get(route, ()))) or "none"
        raise ApiError(
            "bad_request",
            f"unknown query parameter(s): {', '.join(sorted(unknown))} (this route takes: {known})",
        )


def int_param(params: Mapping[str, str], name: str, default: int | None) -> Any:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError("bad_request", f"{name} must be an integer, not {text!r}") from None
    if not 0 <= value <= MAX_INT:
        raise ApiError("bad_request", f"{name} must be between 0 and {MAX_INT}")
    return value


def time_param(params: Mapping[str, str], name: str, default: int | None) -> Any:
    """A time as epoch milliseconds, given as digits or as ISO-8601 (``2026-01-31T10:00:00Z``;
    without a zone it is UTC)."""
    text = params.get(name)
    if text is None:
        return default
    stripped = text.strip()
    if stripped.isascii() and stripped.lstrip("-").isdigit():
        return int_param({name: stripped}, name, default)
    try:
        when = dt.datetime.fromisoformat(stripped)
    except ValueError:
        raise ApiError(
            "bad_request", f"{name} must be epoch milliseconds or ISO-8601, not {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    ms = (when - _EPOCH) // dt.timedelta(milliseconds=1)
    if not 0 <= ms <= MAX_INT:
        raise ApiError("bad_request", f"{name} must not be before 1970")
    return ms


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
