"""Which query parameters each route takes: the one place to add a read option.

A parameter a route does not know is a mistake the caller should hear about
(a typo such as ``max-lag`` would otherwise be ignored silently), so it is
answered with 400 naming it.
"""

from __future__ import annotations

from tablecast.server.errors import ApiError

#: options every routed read takes (who may answer, and how fresh it must be)
_READ = frozenset({"max_lag", "redirect"})
_KEY = frozenset({"key"})  # the ?key= form of a key route, for any key text

KNOWN: dict[str, frozenset[str]] = {
    "key": _READ | _KEY | {"min_offset", "timeout_ms"},
    "windows": _READ | _KEY | {"from", "to"},
    "metadata": _KEY,
    "batch_get": frozenset({"max_lag"}),
    "range": frozenset({"from", "to", "prefix", "limit", "cursor", "owned", "max_lag"}),
    "count": frozenset({"max_lag"}),
    "internal_scan": frozenset({"partitions", "start", "end", "limit", "max_lag"}),
    "internal_count": frozenset({"partitions", "max_lag"}),
    "internal_snapshot": frozenset({"partitions", "keys", "spans", "at_least"}),
}


def check(route: str, params: dict[str, str]) -> None:
    unknown = params.keys() - KNOWN.get(route, frozenset())
    if unknown:
        known = ", ".join(sorted(KNOWN.get(route, ()))) or "none"
        raise ApiError(
            "bad_request",
            f"unknown query parameter(s): {', '.join(sorted(unknown))} (this route takes: {known})",
        )
