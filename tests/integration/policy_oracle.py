"""The fuzz tests' policy, and a judge of answers: no answer may carry a row it forbids.

The fuzz token may read the keys of table ``kv`` that start with its ``shard``
claim, "k1" — 11 of the table's 41 rows (k1, k10 … k19) — and nothing else.
:func:`violations` looks at one request and its answer and names every row,
table or count the answer should not have shown. The schemathesis hook
(``schemathesis_policy_hook``) and the hypothesis tests both call it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import orjson

POLICY = {
    "rules": [
        {"match": {"role": "fuzzer"}, "tables": {"kv": {"key_prefix": "{shard}"}}},
        {"match": {"role": "admin"}, "tables": {"*": "*"}},  # the fuzz token is no admin
    ]
}
CLAIMS = {"sub": "fuzz", "role": "fuzzer", "shard": "k1"}
TABLE = "kv"
PREFIX = "k1"
GRANTED_ROWS = 11


def _allowed(key: Any) -> bool:
    return isinstance(key, str) and key.startswith(PREFIX)


def violations(method: str, url: str, status: int, body: bytes) -> list[str]:
    """What the answer shows that the policy forbids (empty: nothing)."""
    if status != 200:
        return []  # errors carry no rows: their messages name only what the caller sent
    parts = urlsplit(url)
    path = unquote(parts.path)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []  # /metrics and the like: no table data
    bad: list[str] = []
    if path == "/v1/tables":
        bad += [f"lists table {t['name']}" for t in doc["tables"] if t["name"] != TABLE]
    elif path == "/v1/cluster":
        tables = {r["table"] for n in doc["nodes"] for r in n["replicas"]}
        bad += [f"shows replicas of {t}" for t in tables - {TABLE}]
    elif path.startswith(("/v1/tables/", "/internal/tables/")):
        segments = path.split("/", 5)
        table, rest = segments[3], "/".join(segments[4:])
        if table != TABLE:
            return [f"{method} {path} answered 200 on a table not granted"]
        if rest.startswith("keys/") and rest.endswith(("/metadata", "/windows", "/history")):
            key = rest[5:].rsplit("/", 1)[0]
            if not _allowed(key):
                bad.append(f"{path} answered for key {key!r}")
        elif rest in ("metadata", "windows", "history") and not _allowed(query.get("key")):
            bad.append(f"{path} answered for key {query.get('key')!r}")
        elif rest.startswith("keys") and "key" in doc and not _allowed(doc["key"]):
            bad.append(f"{path} returned key {doc['key']!r}")
        elif rest == "keys:batchGet":
            for item in doc["results"]:
                if (item.get("found") or "value" in item) and not _allowed(item["key"]):
                    bad.append(f"batchGet returned key {item['key']!r}")
        elif rest == "range" or rest.startswith("index/"):
            bad += [f"{rest} returned {x['key']!r}" for x in doc["items"] if not _allowed(x["key"])]
        elif rest == "scan":
            for sort_hex, item in doc["items"]:
                if "view" in query:  # a view's items say their key; otherwise [key hex, value]
                    if not _allowed(item["key"]):
                        bad.append(f"internal scan returned {item['key']!r}")
                elif not bytes.fromhex(sort_hex).startswith(PREFIX.encode()):
                    bad.append(f"internal scan returned {bytes.fromhex(sort_hex)!r}")
        if "count" in doc and doc["count"] > GRANTED_ROWS:
            bad.append(f"{path} counted {doc['count']} rows, more than the {GRANTED_ROWS} granted")
    return bad
