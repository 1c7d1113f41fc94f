"""How numbers and times in query parameters are read (which parameters a route takes is
declared with the route, :mod:`tablecast.http.routes`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from tablecast.query.errors import ApiError

#: the largest integer any parameter takes (Kafka offsets and epoch ms are int64)
MAX_INT = 2**63 - 1


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
