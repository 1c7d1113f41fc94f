"""``tablecast query|history|tables|cluster``: the HTTP API from the shell, through
``tablecast.Client``."""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from tablecast.cli.main import fail
from tablecast.client import Client, QueryError


def run(args: argparse.Namespace) -> int:
    urls = [u.strip() for u in args.url.split(",") if u.strip()]
    try:
        with Client(urls, token=args.token, verify=args.ca or True) as client:
            answer: Any
            if args.command == "query":
                answer = client.get(args.table, args.key, as_of=args.as_of)
                if answer is None:
                    when = f" at {args.as_of}" if args.as_of else ""
                    return fail(f"key {args.key!r} not found in {args.table!r}{when}", 1)
            elif args.command == "history":
                answer = {
                    "items": list(
                        client.history(args.table, args.key, args.time_from, args.time_to)
                    )
                }
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
