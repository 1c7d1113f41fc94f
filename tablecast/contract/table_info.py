"""A table's description: its topic, partitions, serdes, kind, store and views, as the
catalog topic carries it (one JSON value per table) and every reader of the table
topics needs it.

Two optional fields of ``extra`` ask the nodes to keep more than the latest
row per key: ``"history_ms": N`` (a positive integer) keeps every
version of every key for N ms of record time, and ``"indexes": ["NAME", ...]``
keeps the secondary indexes whose values the table's records carry in the
header of :mod:`tablecast.contract.index_codec`. Both are for ``kv`` tables only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Literal

import orjson

from tablecast import serde
from tablecast.contract import index_codec
from tablecast.contract.json_path import BadPath, JsonPath
from tablecast.contract.partitioner import DEFAULT, PARTITIONERS, UNKNOWN, Partitioner, unplaced
from tablecast.contract.views import Views
from tablecast.contract.window_keys import (
    SESSION_SUFFIX,
    STREAMS_INNER,
    STREAMS_LAYOUTS,
    STREAMS_SESSION,
    WINDOW_SUFFIX,
)

KINDS = ("kv", "window")
STORES = ("rocksdb", "memory")


class BadEntry(ValueError):
    """A catalog record that does not describe a table this version can serve."""


@dataclass(frozen=True)
class TableInfo:
    name: str
    topic: str
    partitions: int
    key: dict[str, Any]
    value: dict[str, Any]
    kind: Literal["kv", "window"] = "kv"
    is_global: bool = False
    store: Literal["rocksdb", "memory"] = "rocksdb"
    extra: dict[str, Any] = field(default_factory=dict)
    #: how the topic's writer picks a key's partition (:mod:`tablecast.contract.partitioner`)
    partitioner: str = DEFAULT
    #: written by something else than a pipeline (``tablecast attach``)
    attached: bool = False

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> TableInfo:
        fields = orjson.loads(data)
        known = {k: v for k, v in fields.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    @classmethod
    def checked(cls, name: str, data: bytes) -> TableInfo:
        """The entry recorded under `name`, or :class:`BadEntry` saying what is wrong with it."""
        try:
            fields = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise BadEntry(f"not JSON: {e}") from None
        if not isinstance(fields, dict):
            raise BadEntry("not a JSON object")
        try:
            info = cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})
        except TypeError as e:
            raise BadEntry(str(e)) from None
        problems = []
        if info.name != name:
            problems.append(f"name {info.name!r} differs from the record key {name!r}")
        if not isinstance(info.topic, str) or not info.topic:
            problems.append(f"topic {info.topic!r} is not a topic name")
        p = info.partitions
        if not isinstance(p, int) or isinstance(p, bool) or p <= 0:
            problems.append(f"partitions {p!r} is not a positive integer")
        if info.kind not in KINDS:
            problems.append(f"kind {info.kind!r} is not one of {KINDS}")
        if info.store not in STORES:
            problems.append(f"store {info.store!r} is not one of {STORES}")
        if not isinstance(info.is_global, bool):
            problems.append("is_global is not a boolean")
        if info.partitioner not in PARTITIONERS:
            problems.append(f"partitioner {info.partitioner!r} is not one of {PARTITIONERS}")
        if not isinstance(info.attached, bool):
            problems.append("attached is not a boolean")
        if not isinstance(info.extra, dict):
            problems.append("extra is not an object")
        for side in ("key", "value"):
            spec = getattr(info, side)
            if not isinstance(spec, dict) or not isinstance(spec.get("format"), str):
                problems.append(f"{side} {spec!r} is not a serde spec with a format")
                continue
            if side == "key" and spec["format"] == "debezium":
                fields, head = spec.get("fields"), spec.get("head", "")
                if not (
                    isinstance(fields, list)
                    and fields
                    and all(isinstance(f, str) for f in fields)
                    and isinstance(head, str)
                ):
                    problems.append("a debezium key needs fields (names) and head (a string)")
                    continue
            try:
                getattr(info, f"{side}_serde")  # built now, once: a spec that cannot is refused
            except Exception as e:  # fastavro raises many kinds on a bad schema
                problems.append(f"{side} serde: {e}")
        extra = info.extra if isinstance(info.extra, dict) else {}
        changelog = info.key.get("changelog") if isinstance(info.key, dict) else None
        if info.kind == "window":
            # a session table's windows have no one size: their keys carry start and end;
            # its gap is 0 where it is not known (an attached Kafka Streams session store)
            size = extra.get("session_gap_ms", extra.get("size_ms"))
            least = 0 if changelog == STREAMS_SESSION else 1
            if not isinstance(size, int) or isinstance(size, bool) or size < least:
                problems.append("a window table needs extra.size_ms or session_gap_ms > 0")
        if changelog is not None:
            session = changelog == STREAMS_SESSION
            if changelog not in STREAMS_LAYOUTS:
                problems.append(f"key changelog {changelog!r} is not one of {STREAMS_LAYOUTS}")
            elif info.kind != "window" or session != ("session_gap_ms" in extra):
                problems.append(
                    f"a {changelog} key needs a {'session' if session else 'window'} table"
                )
        key_format = info.key.get("format") if isinstance(info.key, dict) else None
        value_format = info.value.get("format") if isinstance(info.value, dict) else None
        inner = STREAMS_INNER + serde.REGISTRY_FORMATS
        if changelog is not None and key_format not in inner:
            problems.append(f"a {changelog} key's own format is one of {inner}")
        registry_key = isinstance(info.key, dict) and serde.through_registry(info.key)
        if registry_key and (not info.attached or info.partitioner != UNKNOWN):
            # a key's bytes carry the id of the schema it was written with, which its text
            # does not say: nodes look such keys up rather than compute their partition
            problems.append(f"{key_format} keys are read in attached tables, looked up")
        if value_format in serde.REGISTRY_FORMATS and (
            not info.attached or key_format == "debezium"
        ):
            problems.append(f"{value_format} values are read in attached tables, not debezium's")
        if (
            isinstance(info.value, dict)
            and value_format == "debezium"
            and serde.through_registry(info.value)
            and not (info.attached and registry_key)
        ):
            problems.append("debezium values through a registry come with keys through it")
        if info.kind == "window" and extra.get("index_paths"):
            problems.append("indexes are for tables of one row per key, not of windows")
        if isinstance(info.extra, dict):
            problems += _view_problems(info)
        if problems:
            raise BadEntry("; ".join(problems))
        return info

    @cached_property
    def history_ms(self) -> int | None:
        """How long every version of a key is kept (``extra["history_ms"]``); None: not kept."""
        return self.extra.get("history_ms")

    @cached_property
    def indexes(self) -> tuple[str, ...]:
        """The table's secondary indexes (``extra["indexes"]``): what the record header
        :data:`tablecast.contract.index_codec.HEADER` carries values for."""
        return tuple(self.extra.get("indexes", ()))

    @cached_property
    def index_paths(self) -> dict[str, JsonPath]:
        """Indexes whose values the nodes take from each row by a path
        (``extra["index_paths"]``, an attached table's), rather than from a header."""
        return {n: JsonPath(p) for n, p in self.extra.get("index_paths", {}).items()}

    @cached_property
    def views(self) -> Views:
        """What a store of this table keeps besides the latest row per key."""
        return Views(self.history_ms, self.indexes, self._source())

    def _source(self) -> str:
        """What an attached table's rows are made from (a store of other rows starts over);
        "" for a pipeline's table, whose stores predate this."""
        if not self.attached:
            return ""
        made_of = [self.topic, self.key, self.value, self.extra.get("index_paths")]
        return orjson.dumps(made_of, option=orjson.OPT_SORT_KEYS).decode()

    # rebuilt once per table, not per request: an Avro schema is costly to parse
    @cached_property
    def key_serde(self) -> serde.Serde:
        return serde.from_spec(self.key)

    @cached_property
    def value_serde(self) -> serde.Serde:
        return serde.from_spec(self.value)

    @cached_property
    def partition_of(self) -> Callable[[bytes], int]:
        """serialized key -> partition, as the topic's writer picks it (a table whose
        partitioner is unknown raises :class:`~tablecast.contract.partitioner.Unplaced`:
        its keys are looked up, see :attr:`placed`)."""
        if self.partitioner == UNKNOWN:
            return unplaced
        written = getattr(self.key_serde, "writer_bytes", None)
        return Partitioner(self.partitions, self.partitioner, written=written)

    @property
    def window_suffix(self) -> int:
        """The bytes a window table's key has after its inner key: the window's start, or a
        session's start and end (none for a key-value table's)."""
        if self.kind != "window":
            return 0
        return SESSION_SUFFIX if "session_gap_ms" in self.extra else WINDOW_SUFFIX

    @property
    def placed(self) -> bool:
        """Whether a key's partition follows from its bytes (:attr:`partition_of`); else
        a node looks for it (:mod:`tablecast.query.locate`)."""
        return self.partitioner != UNKNOWN

    def partitions_for(self, raw: bytes) -> tuple[int, ...]:
        """The partitions `raw` may be in: its own, or every one when keys are unplaced."""
        if self.partitioner == UNKNOWN:
            return tuple(range(self.partitions))
        return (self.partition_of(raw),)

    def public(self) -> dict[str, Any]:
        """The table as `GET /v1/tables` lists it."""
        out = {
            "name": self.name,
            "topic": self.topic,
            "partitions": self.partitions,
            "kind": self.kind,
            "global": self.is_global,
            "key_format": self.key["format"],
            "value_format": self.value["format"],
            "partitioner": self.partitioner,
        }
        if self.attached:
            out["attached"] = True
        if self.key["format"] == "debezium":  # clients rebuild its writer's bytes as nodes do
            out["key_layout"] = {"head": self.key.get("head", ""), "fields": self.key["fields"]}
        if self.history_ms is not None:
            out["history_ms"] = self.history_ms
        if self.indexes:
            out["indexes"] = list(self.indexes)
        return out


def _view_problems(info: TableInfo) -> list[str]:
    """What is wrong with an entry's history and indexes (the contract in docs/table-topics.md)."""
    problems = []
    history = info.extra.get("history_ms")
    if history is not None and (
        not isinstance(history, int) or isinstance(history, bool) or history <= 0
    ):
        problems.append(f"extra.history_ms {history!r} is not a positive integer (ms)")
    names = info.extra.get("indexes")
    if names is not None:
        if not isinstance(names, list) or not all(
            isinstance(n, str) and index_codec.NAME.fullmatch(n) for n in names
        ):
            problems.append(
                f"extra.indexes {names!r} is not a list of names (1-64 of A-Z a-z 0-9 _ . -)"
            )
        elif len(set(names)) != len(names):
            problems.append(f"extra.indexes {names!r} names an index twice")
    paths = info.extra.get("index_paths")
    if paths is not None:
        if (
            problems
            or not isinstance(paths, dict)
            or not isinstance(names, list)
            or set(paths) != set(names)
        ):
            problems.append("extra.index_paths does not give a path for each of extra.indexes")
        else:
            for name, path in paths.items():
                try:
                    JsonPath(path)
                except (BadPath, TypeError) as e:
                    problems.append(f"extra.index_paths[{name!r}]: {e}")
    if (history is not None or names) and info.kind != "kv":
        problems.append("history and indexes are kept for kv tables only")
    return problems
