"""``tablecast query|tables|cluster``: the HTTP API from the shell, through ``tablecast.Client``."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from tablecast.cli.errors import fail
from tablecast.client import Client, QueryError


def run(args: argparse.Namespace) -> int:
    urls = [u.strip() for u in args.url.split(",") if u.strip()]
    try:
        with Client(urls, token=args.token, verify=args.ca or True) as client:
            answer: Any
            if args.command == "query":
                answer = client.get(args.table, args.key)
                if answer is None:
                    return fail(f"key {args.key!r} not found in {args.table!r}", 1)
            elif args.command == "tables":
                answer = {"tables": client.tables()}
            else:
                answer = client.cluster()
    except QueryError as e:
        return fail(str(e), 1)
    except ConnectionError as e:
        return fail(f"cannot reach {args.url}: {e}")
    print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    return 0
