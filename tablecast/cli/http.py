"""``tablecast query|tables|cluster``: the HTTP API from the shell."""

from __future__ import annotations

import argparse
import sys
from urllib.parse import quote

import httpx
import orjson


def run(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/")
    if args.command == "query":
        path = f"/v1/tables/{quote(args.table, safe='')}/keys/{quote(args.key, safe='')}"
    elif args.command == "tables":
        path = "/v1/tables"
    else:
        path = "/v1/cluster"
    try:
        answer = httpx.get(base + path, timeout=10.0)
    except httpx.HTTPError as e:
        print(f"cannot reach {base}: {e}", file=sys.stderr)
        return 2
    try:
        body = orjson.dumps(answer.json(), option=orjson.OPT_INDENT_2).decode()
    except ValueError:
        body = answer.text
    print(body, file=sys.stdout if answer.is_success else sys.stderr)
    return 0 if answer.is_success else 1
