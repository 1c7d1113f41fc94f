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
            else:
                raise UnknownSchema(f"schema {schema_id} is {kind}, which is not read yet")
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
