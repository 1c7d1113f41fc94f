"""Writer schemas from a Schema Registry (Confluent's REST API, which Apicurio Registry
also answers), for the values of attached topics written in its wire format: each schema
fetched once by id and kept, each value decoded to the JSON its table keeps.

The catalog holds a table's registry URL and nothing secret; a node reaches the registry
with its own settings (:class:`~tablecast.kafka.registry_config.RegistrySettings`).
"""

from __future__ import annotations

import datetime
import decimal
import io
import re
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import fastavro
import httpx
import orjson

from tablecast.contract import confluent_wire
from tablecast.kafka import registry_config

#: payload -> the row as JSON bytes; raises ValueError for a payload its schema does not read
Decode = Callable[[bytes], bytes]
#: how long one request to the registry may take: the ingestion waits for it, so not long
TIMEOUT_S = 3.0


class UnknownSchema(ValueError):
    """The registry has no schema of this id (or one of a kind not read here)."""


class RegistryUnavailable(Exception):
    """The registry did not answer: the record waits for it (it is never skipped)."""


class SchemaUnreadable(RegistryUnavailable):
    """The registry gave a schema this node cannot read (an extra not installed, a
    reference the registry does not have, a schema fastavro or protoc refuses): its records
    wait, as for an unreachable registry, rather than be skipped; the partition's error
    says why."""


#: a registry that did not answer is not asked again for this long (each try may take
#: TIMEOUT_S of the ingestion, which every table of the node shares)
QUIET_S = 5.0
#: an id the registry said it does not have is not asked for again for this long
UNKNOWN_TTL_S = 60.0
#: other subjects' schemas one schema may reference, theirs included
MAX_REFERENCES = 100


def _json_default(obj: Any) -> Any:
    """Avro values orjson does not write itself, as JSON (bytes and fixed as their Latin-1
    text, as Avro's own JSON encoding writes them; a decimal as its exact text)."""
    if isinstance(obj, bytes):
        return obj.decode("latin-1")
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    if isinstance(obj, (datetime.date, datetime.time, uuid.UUID)):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON")


def _avro(schema_text: str, referenced: dict[str, str] | None = None) -> Decode:
    """Values of an Avro schema; `referenced`: the schemas it references (their named types
    used in it), each after those it references."""
    named: dict[str, Any] = {}
    for name, text in (referenced or {}).items():
        try:
            fastavro.parse_schema(orjson.loads(text), named_schemas=named)
        except Exception as e:  # fastavro's parse errors are not ValueErrors
            raise SchemaUnreadable(
                f"{name}, which a schema references: an Avro schema fastavro cannot read: {e}"
            ) from None
    try:
        parsed = fastavro.parse_schema(orjson.loads(schema_text), named_schemas=named)
    except Exception as e:  # fastavro's parse errors are not ValueErrors
        raise SchemaUnreadable(f"an Avro schema fastavro cannot read: {e}") from None

    def decode(payload: bytes) -> bytes:
        buf = io.BytesIO(payload)
        try:
            row = fastavro.schemaless_reader(buf, parsed, None)
        except Exception as e:  # fastavro raises many kinds on bytes its schema does not read
            raise ValueError(f"not Avro of its schema: {type(e).__name__}: {e}") from None
        if buf.tell() != len(payload):
            raise ValueError(f"{len(payload) - buf.tell()} bytes after the Avro record")
        return orjson.dumps(row, default=_json_default)

    return decode


def _json(payload: bytes) -> bytes:
    try:
        orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from None
    return payload


def _protobuf(schema_text: str, schema_id: int, referenced: dict[str, str] | None = None) -> Decode:
    """Messages of a Protobuf schema, answered in the proto3 JSON mapping. The schema is
    a base64 FileDescriptorProto (what confluent-kafka registers) or .proto text (what
    Java's serializer registers: compiled with protoc, from ``tablecast[protobuf]``);
    `referenced`: the files it imports from other subjects, by import name."""
    try:
        from google.protobuf import descriptor_pool, json_format, message_factory
    except ImportError:
        raise SchemaUnreadable(
            f"schema {schema_id} is Protobuf: reading it needs pip install 'tablecast[protobuf]'"
        ) from None

    referenced = referenced or {}
    main = f"schema-{schema_id}.proto"
    while main in referenced:  # a name no import uses
        main = "_" + main
    proto = _serialized_descriptor(schema_text)
    if proto is None:  # .proto text: one protoc run compiles it and every file it imports
        compiled = _compiled(schema_text, schema_id, referenced, main)
        proto = compiled[main]
        imports = {n: compiled[n] for n in referenced if n in compiled}
    else:
        imports = {n: _file_descriptor(t, schema_id, referenced, n) for n, t in referenced.items()}
    pool = descriptor_pool.DescriptorPool()
    try:
        _add_with_imports(pool, proto, imports)
        file = pool.FindFileByName(proto.name)
    except SchemaUnreadable:
        raise
    except Exception as e:  # the runtime's own errors on a descriptor it refuses
        raise SchemaUnreadable(f"schema {schema_id}: {type(e).__name__}: {e}") from None

    def decode(payload: bytes) -> bytes:
        path, body = confluent_wire.message_indexes(payload)
        try:
            desc = file.message_types_by_name[proto.message_type[path[0]].name]
            for i in path[1:]:
                desc = desc.nested_types[i]
        except (IndexError, KeyError):
            raise ValueError(f"message path {path} is not in schema {schema_id}") from None
        message = message_factory.GetMessageClass(desc)()
        try:
            message.ParseFromString(body)
            return orjson.dumps(json_format.MessageToDict(message))
        except Exception as e:  # DecodeError, an Any of an unknown type, and the like
            raise ValueError(f"not a {desc.full_name} it can answer: {e}") from None

    return decode


def _file_descriptor(
    schema_text: str, schema_id: int, referenced: dict[str, str], name: str
) -> Any:
    """A schema's FileDescriptorProto; .proto text is compiled as the file `name` (the name
    its importers know it by)."""
    proto = _serialized_descriptor(schema_text)
    if proto is None:
        proto = _compiled(schema_text, schema_id, referenced, name)[name]
    return proto


def _serialized_descriptor(schema_text: str) -> Any:
    """The FileDescriptorProto a schema registered as one (base64) holds; None for .proto
    text."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(base64.b64decode(schema_text, validate=True))
    except (binascii.Error, DecodeError, ValueError):
        return None
    return proto if proto.name else None


#: one part of an imported file's path, as a schema's reference names it
_PROTO_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _compiled(
    schema_text: str, schema_id: int, referenced: dict[str, str], name: str
) -> dict[str, Any]:
    """.proto text compiled by protoc (grpcio-tools) as the file `name`, beside the .proto
    text of the files it imports from other subjects (`referenced`): the FileDescriptorProto
    of it and of every file it imports, by name."""
    import os
    import tempfile

    from google.protobuf import descriptor_pb2

    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise SchemaUnreadable(
            f"schema {schema_id} is .proto text: reading it needs protoc "
            "(pip install 'tablecast[protobuf]')"
        ) from None
    with tempfile.TemporaryDirectory(prefix="tablecast-proto-") as tmp:
        for file, text in {**referenced, name: schema_text}.items():
            # a name becomes a path and protoc's argument: plain relative parts only
            parts = file.split("/")
            if not file.endswith(".proto") or not all(_PROTO_PART.fullmatch(p) for p in parts):
                raise SchemaUnreadable(f"schema {schema_id} imports {file!r}: not a file name")
            try:
                os.makedirs(os.path.join(tmp, *parts[:-1]), exist_ok=True)
                with open(os.path.join(tmp, *parts), "w") as f:
                    f.write(text)
            except (OSError, ValueError) as e:
                raise SchemaUnreadable(f"schema {schema_id}: {file}: {e}") from None
        out = os.path.join(tmp, "schema.pb")
        includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        code = protoc.main(
            [
                "protoc",
                f"-I{tmp}",
                f"-I{includes}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                name,
            ]
        )
        if code != 0:
            raise SchemaUnreadable(f"schema {schema_id}: protoc could not compile its .proto text")
        files = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            files.ParseFromString(f.read())
    return {file.name: file for file in files.file}


def _add_with_imports(pool: Any, proto: Any, imports: dict[str, Any]) -> None:
    """`proto` into `pool`, after the files it imports: those Protobuf itself ships (its
    well-known types) and other subjects' (`imports`, by name, as the schema's references
    gave them)."""
    import importlib

    from google.protobuf import descriptor_pb2, descriptor_pool

    for name in proto.dependency:
        if name in imports:
            _add_with_imports(pool, imports[name], imports)
        elif name.startswith("google/protobuf/"):
            module = "google.protobuf." + name.removeprefix("google/protobuf/")[:-6] + "_pb2"
            try:
                importlib.import_module(module)
                found = descriptor_pool.Default().FindFileByName(name)
            except (ImportError, KeyError):
                raise SchemaUnreadable(f"the schema imports {name}, not known here") from None
            dep = descriptor_pb2.FileDescriptorProto()
            found.CopyToProto(dep)
            _add_with_imports(pool, dep, imports)
        else:
            raise SchemaUnreadable(f"the schema imports {name}, which its references do not name")
    try:
        pool.FindFileByName(proto.name)
    except KeyError:
        pool.Add(proto)


class Registry:
    """One registry at `url`; `client` for its TLS and auth (an httpx.Client)."""

    def __init__(
        self, url: str, client: httpx.Client | None = None, refused: str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        #: why this process may not read this registry at all (its records wait, saying so)
        self.refused = refused
        self._client = client or httpx.Client(timeout=TIMEOUT_S)
        self._decoders: dict[int, Decode] = {}
        #: ids the registry said it does not have, until when that answer stands
        self._unknown: dict[int, float] = {}
        #: (until when, why) the registry is not asked, after it did not answer
        self._quiet: tuple[float, str] = (0.0, "")
        #: ids whose schema this node could not read: (until when, why) not tried again
        self._unreadable: dict[int, tuple[float, str]] = {}
        #: referenced schemas by (subject, version), which never change once registered
        self._references: dict[tuple[str, int], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def decode(self, data: bytes) -> bytes:
        """A value in the wire format as its row's JSON. ValueError (UnknownSchema among
        them) for a value that is not one: a bad record. :class:`RegistryUnavailable`
        (SchemaUnreadable among them) when its schema cannot be had or read now: the
        record waits (the caller tries again later; it is never skipped)."""
        if self.refused is not None:
            raise SchemaUnreadable(self.refused)
        schema_id, payload = confluent_wire.split(data)
        decoder = self._decoders.get(schema_id)
        if decoder is None:
            decoder = self._fetch(schema_id)
        try:
            return decoder(payload)
        except ValueError:
            raise
        except Exception as e:  # a decoder's surprise is the payload's, never the ingestion's
            raise ValueError(f"{type(e).__name__}: {e}") from None

    def _fetch(self, schema_id: int) -> Decode:
        with self._lock:
            found = self._decoders.get(schema_id)
            if found is not None:
                return found
            now = time.monotonic()
            if self._unknown.get(schema_id, 0.0) > now:
                raise UnknownSchema(f"the registry has no schema {schema_id}")
            until, why = self._unreadable.get(schema_id, (0.0, ""))
            if until > now:
                raise SchemaUnreadable(why)
            until, why = self._quiet
            if until > now:
                raise RegistryUnavailable(why)
            try:
                decoder = self._decoder(schema_id)
            except UnknownSchema:
                _bounded(self._unknown)[schema_id] = now + UNKNOWN_TTL_S
                raise
            except SchemaUnreadable as e:  # the registry answered: what it gave is not read
                _bounded(self._unreadable)[schema_id] = (now + QUIET_S, str(e))
                raise
            except RegistryUnavailable as e:
                self._quiet = (time.monotonic() + QUIET_S, str(e))
                raise
            self._decoders[schema_id] = decoder
            self._unreadable.pop(schema_id, None)
            return decoder

    def _decoder(self, schema_id: int) -> Decode:
        body = self._get(f"/schemas/ids/{schema_id}")
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise SchemaUnreadable(f"{self.url}: schema {schema_id} came as {body!r:.200}")
        kind = body.get("schemaType", "AVRO")
        if kind == "JSON":  # the JSON itself is the row: its schema's references are not read
            return _json
        if kind not in ("AVRO", "PROTOBUF"):
            raise SchemaUnreadable(f"schema {schema_id} is {kind}, which is not read")
        referenced = self._referenced(body.get("references"), {}, set())
        if kind == "AVRO":
            return _avro(body["schema"], referenced)
        return _protobuf(body["schema"], schema_id, referenced)

    def _referenced(
        self, references: Any, found: dict[str, str], seen: set[tuple[str, int]]
    ) -> dict[str, str]:
        """The schemas `references` names (other subjects' versions, and theirs in turn) as
        {reference name: schema text} in `found`, each after those it references."""
        if not references:
            return found
        if not isinstance(references, list):
            raise SchemaUnreadable(f"{self.url}: references came as {references!r:.200}")
        for ref in references:
            name, subject, version = (
                (ref.get("name"), ref.get("subject"), ref.get("version"))
                if isinstance(ref, dict)
                else (None, None, None)
            )
            if not (isinstance(name, str) and isinstance(subject, str)) or not isinstance(
                version, int
            ):
                raise SchemaUnreadable(f"{self.url}: a reference came as {ref!r:.200}")
            if (subject, version) not in seen:
                if len(seen) >= MAX_REFERENCES:
                    raise SchemaUnreadable(f"a schema references more than {MAX_REFERENCES} others")
                seen.add((subject, version))
                self._referenced(self._reference(subject, version).get("references"), found, seen)
            text = self._reference(subject, version)["schema"]
            if found.setdefault(name, text) != text:
                raise SchemaUnreadable(f"a schema references two schemas as {name}")
        return found

    def _reference(self, subject: str, version: int) -> dict[str, Any]:
        """Version `version` of `subject`, as the registry gave it (kept: it never changes).
        Asked for even if soft-deleted since, as Confluent's own deserializers ask: records
        written under a schema that references it are still read by it."""
        body = self._references.get((subject, version))
        if body is None:
            path = f"/subjects/{quote(subject, safe='')}/versions/{version}?deleted=true"
            body = self._get(path)
            if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
                raise SchemaUnreadable(f"{self.url}{path} came as {body!r:.200}")
            _bounded(self._references)[(subject, version)] = body
        return body

    def _get(self, path: str) -> Any:
        try:
            r = self._client.get(self.url + path)
        except Exception as e:  # httpx.HTTPError, and InvalidURL which is not one
            raise RegistryUnavailable(f"{self.url}: {type(e).__name__}: {e}") from None
        code = _error_code(r) if r.status_code == 404 else None
        if code == 40403:  # Confluent's "schema not found"
            raise UnknownSchema(f"the registry has no schema {path.rsplit('/', 1)[1]}")
        if code in (40401, 40402):  # no such subject, or version: a reference it lacks
            raise SchemaUnreadable(f"{self.url}{path}: the registry has no such schema")
        if r.status_code != 200:
            raise RegistryUnavailable(f"{self.url}{path}: HTTP {r.status_code}: {r.text[:200]}")
        try:
            return r.json()
        except ValueError:
            raise RegistryUnavailable(f"{self.url}{path}: not JSON: {r.text[:200]}") from None


def _bounded(kept: dict[Any, Any], most: int = 10_000) -> dict[Any, Any]:
    """`kept`, emptied first when it holds `most` entries (what it holds can be had again)."""
    if len(kept) >= most:
        kept.clear()
    return kept


def _error_code(r: httpx.Response) -> int | None:
    try:
        body = r.json()
    except ValueError:
        return None
    return body.get("error_code") if isinstance(body, dict) else None


_registries: dict[tuple[str, int], Registry] = {}
_registries_lock = threading.Lock()


def registry(url: str) -> Registry:
    """The one Registry of this process for `url` (its schemas fetched once for every table),
    reached with the settings this process was given."""
    settings = registry_config.current()
    with _registries_lock:
        found = _registries.get((url, id(settings)))
        if found is None:
            refused = None
            others = {u for u, i in _registries if i == id(settings) and u != url}
            if settings.props.get("url") and others:
                # one address for two registries would look one's schema ids up in the other
                refused = (
                    f"the registry settings' url stands for one registry, and tables name "
                    f"{url} and {sorted(others)[0]}: serve them from nodes with settings each"
                )
            client = settings.client(TIMEOUT_S)
            found = Registry(settings.address(url), client, refused)
            _registries[(url, id(settings))] = found
        return found
