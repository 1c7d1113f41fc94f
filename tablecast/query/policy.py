"""Who may read what: ``serve --auth-policy FILE``, rules from JWT claims to tables and keys.

The file (YAML or JSON)::

    rules:
      - match: {role: admin}            # every claim named must equal the token's
        tables: {"*": "*"}              # ("*" as a table: every table; as a grant: every key)
      - tables:                         # no match: applies to every token
          activity: {key_prefix: "{sub}"}
          orders: [{key_prefix: "{tenant}/"}, {key_prefix: "public/"}]

A token's grants are the union over the rules whose ``match`` it meets (a
claim that is a list meets a value it contains). ``{claim}`` in a prefix is
replaced by that claim of the token; a claim that is missing, empty, or not a
string or integer makes that one grant give nothing (an empty prefix would
grant the whole table). A prefix applies to the key's serialized bytes, as
``range?prefix=`` does, so it works on string, JSON and bytes keys; on long or
Avro keys only ``"*"`` grants anything.

A token's grants are compiled once, when the token is first verified, and kept
beside it in the verified-token cache (:class:`tablecast.query.auth.Auth`);
per table they are turned once into sorted, disjoint key intervals
(:class:`KeyScope`) that point reads test with one ``bytes.startswith`` and that
range scans and counts intersect their bounds with.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tablecast.contract.table_info import TableInfo
from tablecast.query.errors import ApiError

EVERY = "*"
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
_SCALARS = (str, int, float, bool)
_MISSING = object()

Bound = bytes | None  # None: no bound
Span = tuple[bytes | None, bytes | None]  # [start, end) of serialized keys; None: unbounded


class PolicyError(ValueError):
    """A policy file that cannot be used; the message names the file and the place."""


@dataclass(frozen=True)
class _Grant:
    """One rule's grant on one table: every key (prefix None), or keys starting with a template."""

    prefix: str | None

    def render(self, claims: Mapping[str, Any]) -> str | None:
        """The prefix with the token's claims filled in; None if a claim cannot fill it."""
        assert self.prefix is not None
        failed = False

        def fill(m: re.Match[str]) -> str:
            nonlocal failed
            value = claims.get(m.group(1))
            if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
                failed = True
                return ""
            return str(value)

        text = _PLACEHOLDER.sub(fill, self.prefix)
        return None if failed else text


@dataclass(frozen=True)
class _Rule:
    match: tuple[tuple[str, Any], ...]
    tables: tuple[tuple[str, tuple[_Grant, ...]], ...]

    def matches(self, claims: Mapping[str, Any]) -> bool:
        for name, want in self.match:
            have = claims.get(name, _MISSING)
            if isinstance(have, list):
                if not any(_same(h, want) for h in have):
                    return False
            elif not _same(have, want):
                return False
        return True


def _same(have: Any, want: Any) -> bool:
    # true is not 1 and "1" is not 1: a claim matches only a value of its own kind
    if isinstance(have, bool) or isinstance(want, bool):
        return have is want
    if isinstance(have, str) != isinstance(want, str):
        return False
    return bool(have == want)


class Policy:
    def __init__(self, rules: Iterable[_Rule]) -> None:
        self.rules = tuple(rules)
        #: the file it was loaded from (a node's read processes load it again)
        self.source: str | None = None

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise PolicyError(f"cannot read the policy file {path}: {e.strerror or e}") from None
        kind = "JSON" if path.suffix == ".json" else "YAML"
        try:
            doc = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as e:
            raise PolicyError(f"{path}: not valid {kind}: {str(e).splitlines()[0]}") from None
        policy = cls.parse(doc, str(path))
        policy.source = str(path)
        return policy

    @classmethod
    def parse(cls, doc: Any, source: str = "policy") -> Policy:
        if not isinstance(doc, dict) or set(doc) != {"rules"} or not isinstance(doc["rules"], list):
            raise PolicyError(f'{source}: a policy is {{"rules": [...]}}')
        return cls(_rule(r, f"{source}: rule {i + 1}") for i, r in enumerate(doc["rules"]))

    def grants(self, claims: Mapping[str, Any]) -> Grants:
        """What a token with these claims may read: the union of the rules it matches."""
        tables: dict[str, set[str] | None] = {}
        for rule in self.rules:
            if not rule.matches(claims):
                continue
            for table, grants in rule.tables:
                for grant in grants:
                    if table in tables and tables[table] is None:
                        break  # already every key
                    if grant.prefix is None:
                        tables[table] = None
                        break
                    prefix = grant.render(claims)
                    if prefix is None:
                        continue
                    if prefix == "":  # written as "": the whole table, as "*"
                        tables[table] = None
                        break
                    tables.setdefault(table, set()).add(prefix)  # type: ignore[union-attr]
        return Grants({t: None if p is None else frozenset(p) for t, p in tables.items()})


def _rule(raw: Any, where: str) -> _Rule:
    if not isinstance(raw, dict) or not set(raw) <= {"match", "tables"} or "tables" not in raw:
        raise PolicyError(f'{where}: a rule is {{"match": {{...}}, "tables": {{...}}}}')
    match = raw.get("match") or {}
    if not isinstance(match, dict):
        raise PolicyError(f"{where}: match is a mapping of claim names to values")
    for name, value in match.items():
        if not isinstance(value, _SCALARS):
            raise PolicyError(
                f"{where}: match.{name} must be a string, number or boolean, not {value!r}"
            )
    tables = raw["tables"]
    if not isinstance(tables, dict) or not tables:
        raise PolicyError(f'{where}: tables maps table names (or "*") to grants')
    compiled = []
    for table, grant in tables.items():
        items = grant if isinstance(grant, list) else [grant]
        compiled.append((str(table), tuple(_grant(g, f"{where}: tables.{table}") for g in items)))
    return _Rule(tuple(match.items()), tuple(compiled))


def _grant(raw: Any, where: str) -> _Grant:
    if raw == EVERY:
        return _Grant(None)
    if isinstance(raw, dict) and set(raw) == {"key_prefix"} and isinstance(raw["key_prefix"], str):
        return _Grant(raw["key_prefix"])
    raise PolicyError(f'{where}: a grant is "*" or {{"key_prefix": "..."}}, not {raw!r}')


class Grants:
    """What one verified token may read; kept with the token in the auth cache."""

    __slots__ = ("_scopes", "_tables")

    def __init__(self, tables: dict[str, frozenset[str] | None]) -> None:
        #: table (or "*") -> None for every key, else the key prefixes
        self._tables = tables
        #: table -> (the catalog entry it was made for, its scope)
        self._scopes: dict[str, tuple[TableInfo, KeyScope | None]] = {}

    def allows_table(self, name: str) -> bool:
        return name in self._tables or EVERY in self._tables

    def reads_everything(self) -> bool:
        """Whether the token may read every key of every table (``"*": "*"``)."""
        return EVERY in self._tables and self._tables[EVERY] is None

    def require_table(self, name: str) -> None:
        """403 unless the token may read some of `name` (asked before the table is looked
        up, so a caller cannot learn which tables exist that it may not read)."""
        if not self.allows_table(name):
            raise ApiError("forbidden", f"this token may not read table {name!r}")

    def table_scope(
        self, name: str, lookup: Callable[[str], TableInfo]
    ) -> tuple[TableInfo, KeyScope | None]:
        """The table `lookup(name)` and the token's readable part of it (None: all of it).

        403 before the lookup when the token may read none of it, so no 404 tells a
        caller which tables exist. A table asked before was granted then: one dict
        lookup, and the scope is reused while the catalog entry (its key format) is
        the same object."""
        hit = self._scopes.get(name)
        if hit is None:
            self.require_table(name)
        info = lookup(name)
        if hit is not None and hit[0] is info:
            return info, hit[1]
        own, every = self._tables.get(name, frozenset()), self._tables.get(EVERY, frozenset())
        if own is None or every is None:
            scope = None
        else:
            scope = KeyScope.of(own | every, info.key_serde.format)
        if len(self._scopes) < 1024:  # a token names few tables; bound it all the same
            self._scopes[name] = (info, scope)
        return info, scope

    def __repr__(self) -> str:
        return f"Grants({self._tables!r})"


class KeyScope:
    """The keys of one table a token may read: sorted, disjoint [start, end) spans of
    serialized keys, one per granted prefix that no shorter granted prefix covers."""

    __slots__ = ("prefixes", "spans")

    def __init__(self, prefixes: Iterable[bytes]) -> None:
        kept: list[bytes] = []
        for p in sorted(prefixes):
            if not kept or not p.startswith(kept[-1]):  # sorted: a covering prefix comes first
                kept.append(p)
        self.prefixes = tuple(kept)
        self.spans = tuple((p, prefix_end(p)) for p in kept)

    @classmethod
    def of(cls, prefixes: Iterable[str], key_format: str) -> KeyScope:
        """Prefixes as serialized key bytes; none apply to keys that are not text or bytes."""
        if key_format in ("string", "json"):
            return cls(p.encode() for p in prefixes)
        if key_format == "bytes":
            out = []
            for p in prefixes:
                try:
                    out.append(p.encode("latin-1"))
                except UnicodeEncodeError:
                    continue  # no bytes key starts with it
            return cls(out)
        return cls(())

    def allows(self, raw: bytes) -> bool:
        return raw.startswith(self.prefixes)

    def clip(self, start: Bound, end: Bound) -> list[Span]:
        """The granted spans within [start, end), in key order."""
        out: list[Span] = []
        for lo, hi in self.spans:
            if start is not None and start > lo:
                lo = start
            if end is not None and (hi is None or end < hi):
                hi = end
            if hi is None or lo < hi:
                out.append((lo, hi))
        return out


def prefix_end(prefix: bytes) -> bytes | None:
    """The least byte string above every one that starts with `prefix` (None: no bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])
