"""The HTTP API reference (``docs/http-api.md``) written from the OpenAPI document.

``python -m tablecast.http.apidoc > docs/http-api.md`` regenerates it; a unit
test checks the committed file is what this prints, so the reference never
drifts from what the nodes serve at ``/openapi.json``.
"""

from __future__ import annotations

from typing import Any

from tablecast.http.openapi import document

HEADER = """# HTTP API reference

Every node answers every request (reads of partitions it does not hold are
forwarded to a node that does). Bodies are JSON; errors are
`{"error": {"code", "message"}}`. This page is generated from the document
every node serves at `/openapi.json`
(`python -m tablecast.http.apidoc > docs/http-api.md`).

Read answers carry `X-Tablecast-Node` (the node that read the store, or that
merged the answer of a read over many partitions), `X-Tablecast-Lag` (records
the replica was behind its topic; the most of any replica read),
`X-Tablecast-Staleness-Ms` (milliseconds since the replica was last known at
its topic's end; 0 while it is) and `X-Tablecast-Position`: an opaque token of
the offsets the answer is exact at — `TABLE@P:O` for a read of one partition,
`TABLE@P:O,P:O,…` for one of many — every record of those partitions below
those offsets reflected, none after them. Pass a token back as `?after=` (or
header `X-Tablecast-After`) on any read of the same table, on any node, and
it is answered only from replicas at least that far (waiting up to
`timeout_ms`, then 504): reads that never go backwards. A key is given
by its text form in the path, URL-encoded, or — for any key text, including
one ending in `/windows`, `/metadata` or `/history`, which a decoded path
cannot carry — as `?key=` on `/v1/tables/{table}/keys`, `/windows`,
`/history` and `/metadata`.
A query parameter a route does not take is answered with 400 naming it.

With auth on, every `/v1` request needs `Authorization: Bearer <JWT>`; with
`--auth-policy` each answer holds only what the token's grants cover (403 for
a table or key outside them, `"forbidden": true` for such a key in a batch),
and `--rate-limit` answers 429 with `Retry-After` — see `docs/security.md`.
"""


def _schema(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    bounds = [f"{k} {schema[k]}" for k in ("minimum", "maximum", "maxItems") if k in schema]
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _shape(schema: dict[str, Any]) -> str:
    """A response schema in one line: {field, field: [ {…} ], optional?} (an object that
    names its required fields marks the others)."""
    if schema.get("type") == "object" and "properties" in schema:
        required = schema.get("required")
        inner = ", ".join(
            (f"{name}: {_shape(sub)}" if sub.get("properties") or sub.get("items") else name)
            + ("?" if required is not None and name not in required else "")
            for name, sub in schema["properties"].items()
        )
        return "{" + inner + "}"
    if schema.get("type") == "array" and "items" in schema:
        return "[" + _shape(schema["items"]) + "]"
    return _schema(schema)


def markdown() -> str:
    doc = document()
    out = [HEADER]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            out.append(f"\n## `{method.upper()} {path}`\n\n{op['summary']}.\n")
            params = op.get("parameters", [])
            if params:
                out.append("\n| parameter | in | type | required | meaning |")
                out.append("|---|---|---|---|---|")
                for p in params:
                    req = "yes" if p.get("required") else ""
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_schema(p['schema'])} | {req} "
                        f"| {p['description']} |"
                    )
                out.append("")
            body = op.get("requestBody")
            if body:
                schema = body["content"]["application/json"]["schema"]
                out.append(f"\nRequest body: `{_shape(schema)}`\n")
            out.append("\n| status | answer |\n|---|---|")
            for status, answer in op["responses"].items():
                content = answer.get("content", {}).get("application/json", {})
                shape = content.get("schema", {})
                text = "error JSON" if "$ref" in shape else f"`{_shape(shape)}`" if shape else ""
                out.append(f"| {status} | {answer['description']}{': ' + text if text else ''} |")
            out.append("")
    codes = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
    out.append("\n## Error codes\n\n" + ", ".join(f"`{c}`" for c in codes["enum"]) + "\n")
    return "\n".join(out)


if __name__ == "__main__":
    print(markdown(), end="")
