"""``tablecast query|tables|cluster``: the HTTP API from the shell, through ``tablecast.Client``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from tablecast.client import Client, QueryError


def run(args: argparse.Namespace) -> int:
    urls = [u.strip() for u in args.url.split(",") if u.strip()]
    try:
        with Client(urls, token=getattr(args, "token", None)) as client:
            answer: Any
            if args.command == "query":
                answer = client.get(args.table, args.key)
                if answer is None:
                    print(f"key {args.key!r} not found in {args.table!r}", file=sys.stderr)
                    return 1
            elif args.command == "tables":
                answer = {"tables": client.tables()}
            else:
                answer = client.cluster()
    except QueryError as e:
        print(str(e), file=sys.stderr)
        return 1
    except ConnectionError as e:
        print(f"cannot reach {args.url}: {e}", file=sys.stderr)
        return 2
    print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    return 0
