"""``tablecast query|history|watch|tables|cluster``: the HTTP API from the shell, through
``tablecast.Client``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from tablecast.cli.errors import Failure, UsageError
from tablecast.client import Client, QueryError, WatchError


def run(args: argparse.Namespace) -> int:
    urls = [u.strip() for u in args.url.split(",") if u.strip()]
    try:
        with Client(urls, token=args.token, verify=args.ca or True) as client:
            answer: Any
            if args.command == "watch":
                return _watch(client, args)
            if args.command == "query":
                answer = client.get(args.table, args.key, as_of=args.as_of)
                if answer is None:
                    when = f" at {args.as_of}" if args.as_of else ""
                    raise Failure(f"key {args.key!r} not found in {args.table!r}{when}")
            elif args.command == "history":
                answer = {
                    "items": list(
                        client.history(
                            args.table, args.key, args.time_from, args.time_to, order=args.order
                        )
                    )
                }
            elif args.command == "tables":
                answer = {"tables": client.tables()}
            else:
                answer = client.cluster()
    except (QueryError, WatchError) as e:
        raise Failure(str(e)) from None
    except ConnectionError as e:
        raise Failure(f"cannot reach {args.url}: {e}") from None
    print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    return 0


def _watch(client: Client, args: argparse.Namespace) -> int:
    """One JSON line per snapshot row and change, flushed as it comes; a note on stderr
    when the snapshot is complete. Runs until interrupted."""
    if not (args.keys or args.prefix is not None or args.start or args.end):
        raise UsageError("watch what? give KEY..., --prefix, or --from/--to")
    events = client.watch(
        args.table,
        key=args.keys or None,
        prefix=args.prefix,
        from_=args.start,
        to=args.end,
        snapshot=not args.no_snapshot,
        since=args.since,
    )
    for e in events:
        if e.event == "ready":
            print(
                f"-- snapshot complete (id {e.id}); following changes", file=sys.stderr, flush=True
            )
            continue
        line = {
            "event": e.event,
            "key": e.key,
            "value": e.value,
            "partition": e.partition,
            "offset": e.offset,
            "id": e.id,
        }
        if e.timestamp is not None:
            line["timestamp"] = e.timestamp
        print(orjson.dumps(line).decode(), flush=True)
    return 0
