"""Writer schemas from a Schema Registry (Confluent's REST API, which Apicurio Registry
also answers), for the values of attached topics written in its wire format: each schema
fetched once by id and kept, each value decoded to the JSON its table keeps."""

from __future__ import annotations

import datetime
import decimal
import io
import threading
import uuid
from collections.abc import Callable
from typing import Any

import fastavro
import httpx
import orjson

from tablecast.contract import confluent_wire

#: payload -> the row as JSON bytes; raises ValueError for a payload its schema does not read
Decode = Callable[[bytes], bytes]
#: how long one request to the registry may take: the ingestion waits for it, so not long
TIMEOUT_S = 3.0


class UnknownSchema(ValueError):
    """The registry has no schema of this id (or one of a kind not read here)."""


class RegistryUnavailable(Exception):
    """The registry did not answer: the record waits for it (it is never skipped)."""


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


def _avro(schema_text: str) -> Decode:
    parsed = fastavro.parse_schema(orjson.loads(schema_text))

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


def _protobuf(schema_text: str, schema_id: int) -> Decode:
    """Messages of a Protobuf schema, answered in the proto3 JSON mapping. The schema is
    a base64 FileDescriptorProto (what confluent-kafka registers) or .proto text (what
    Java's serializer registers: compiled with protoc, from ``tablecast[protobuf]``)."""
    try:
        from google.protobuf import descriptor_pool, json_format, message_factory
    except ImportError:
        raise UnknownSchema(
            f"schema {schema_id} is Protobuf: reading it needs pip install 'tablecast[protobuf]'"
        ) from None

    proto = _file_descriptor(schema_text, schema_id)
    pool = descriptor_pool.DescriptorPool()
    _add_with_imports(pool, proto)
    file = pool.FindFileByName(proto.name)

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
        except Exception as e:  # DecodeError, and others from the C implementation
            raise ValueError(f"not a {desc.full_name}: {e}") from None
        return orjson.dumps(json_format.MessageToDict(message))

    return decode


def _file_descriptor(schema_text: str, schema_id: int) -> Any:
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(base64.b64decode(schema_text, validate=True))
        if proto.name:
            return proto
    except (binascii.Error, DecodeError, ValueError):
        pass
    return _compiled(schema_text, schema_id)


def _compiled(schema_text: str, schema_id: int) -> Any:
    """.proto text as its FileDescriptorProto, compiled by protoc (grpcio-tools)."""
    import os
    import tempfile

    from google.protobuf import descriptor_pb2

    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise UnknownSchema(
            f"schema {schema_id} is .proto text: reading it needs protoc "
            "(pip install 'tablecast[protobuf]')"
        ) from None
    with tempfile.TemporaryDirectory(prefix="tablecast-proto-") as tmp:
        with open(os.path.join(tmp, "schema.proto"), "w") as f:
            f.write(schema_text)
        out = os.path.join(tmp, "schema.pb")
        includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        code = protoc.main(
            ["protoc", f"-I{tmp}", f"-I{includes}", f"--descriptor_set_out={out}", "schema.proto"]
        )
        if code != 0:
            raise UnknownSchema(f"schema {schema_id}: protoc could not compile its .proto text")
        files = descriptor_pb2.FileDescriptorSet()
        with open(out, "rb") as f:
            files.ParseFromString(f.read())
    return files.file[0]


def _add_with_imports(pool: Any, proto: Any) -> None:
    """`proto` into `pool`, with the files it imports that Protobuf itself ships (its
    well-known types); an import of another subject's schema is not resolved."""
    import importlib

    from google.protobuf import descriptor_pb2, descriptor_pool

    for name in proto.dependency:
        if name.startswith("google/protobuf/"):
            module = "google.protobuf." + name.removeprefix("google/protobuf/")[:-6] + "_pb2"
            try:
                importlib.import_module(module)
                found = descriptor_pool.Default().FindFileByName(name)
            except (ImportError, KeyError):
                raise UnknownSchema(f"the schema imports {name}, not known here") from None
            dep = descriptor_pb2.FileDescriptorProto()
            found.CopyToProto(dep)
            _add_with_imports(pool, dep)
        else:
            raise UnknownSchema(f"the schema imports {name} (another subject's): not read yet")
    try:
        pool.FindFileByName(proto.name)
    except KeyError:
        pool.Add(proto)


class Registry:
    """One registry at `url`; `client` for its TLS and auth (an httpx.Client)."""

    def __init__(self, url: str, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self._client = client or httpx.Client(timeout=TIMEOUT_S)
        self._decoders: dict[int, Decode] = {}
        self._lock = threading.Lock()

    def decode(self, data: bytes) -> bytes:
        """A value in the wire format as its row's JSON; ValueError (UnknownSchema among
        them) for a value that is not one; :class:`RegistryUnavailable` when its schema
        is not known yet and the registry does not answer (the caller tries again later:
        a record is never skipped for want of its schema)."""
        schema_id, payload = confluent_wire.split(data)
        decoder = self._decoders.get(schema_id)
        if decoder is None:
            decoder = self._fetch(schema_id)
        return decoder(payload)

    def _fetch(self, schema_id: int) -> Decode:
        with self._lock:
            found = self._decoders.get(schema_id)
            if found is not None:
                return found
            body = self._get(f"/schemas/ids/{schema_id}")
            kind = body.get("schemaType", "AVRO")
            if kind == "AVRO":
                decoder = _avro(body["schema"])
            elif kind == "JSON":
                decoder = _json
            elif kind == "PROTOBUF":
                decoder = _protobuf(body["schema"], schema_id)
            else:
                raise UnknownSchema(f"schema {schema_id} is {kind}, which is not read")
            self._decoders[schema_id] = decoder
            return decoder

    def _get(self, path: str) -> dict[str, Any]:
        try:
            r = self._client.get(self.url + path)
        except httpx.HTTPError as e:
            raise RegistryUnavailable(f"{self.url}: {type(e).__name__}: {e}") from None
        if r.status_code == 404:
            raise UnknownSchema(f"the registry has no schema {path.rsplit('/', 1)[1]}")
        if r.status_code != 200:
            raise RegistryUnavailable(f"{self.url}{path}: HTTP {r.status_code}: {r.text[:200]}")
        return r.json()


_registries: dict[str, Registry] = {}
_registries_lock = threading.Lock()


def registry(url: str) -> Registry:
    """The one Registry of this process for `url` (its schemas fetched once for every table)."""
    with _registries_lock:
        found = _registries.get(url)
        if found is None:
            found = _registries[url] = Registry(url)
        return found
