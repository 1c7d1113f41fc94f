"""Random and malformed PostgreSQL protocol traffic against a node's ``--pg-port``.

Each case opens a connection and sends bytes: garbage, a startup packet then
messages of random types and lengths, valid messages with mutated fields, or
SQL made of random fragments. What comes back is read until the node closes
the connection or goes quiet; every message in it must be well framed, a
closed connection must have said why (an ErrorResponse) unless the case asked
to end it, and no answer may be an internal error (SQLSTATE XX000: a bug).
"""

from __future__ import annotations

import asyncio
import random
import struct
from dataclasses import dataclass, field

QUIET_S = 0.3
TYPES = b"QPBDESCHXpdfcFx\x00\xff"
FRAGMENTS = [
    "SELECT", "*", "key", "value", "FROM", "kv", "WHERE", "=", "'a'", "$1", "IN", "(", ")",
    ",", "LIMIT", "-1", "10", "ORDER BY", "count(*)", "->>", "'f'", "::int", "LIKE", "'a%'",
    "AND", "OR", ";", "SET", "SHOW", "tablecast.max_lag", "tablecast.after", "BEGIN",
    "COMMIT", "INSERT", "INTO", "VALUES", "NULL", "'\\x00'", "E'\\n'", "\"kv\"", "public.",
    "information_schema.tables", "version()", ">=", "<", "OFFSET", "$99999999999", "%", "'",
]  # fmt: skip


@dataclass
class Report:
    cases: int = 0
    answered: int = 0
    closed_with_error: int = 0
    quiet: int = 0
    problems: list[str] = field(default_factory=list)


def _msg(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">i", len(payload) + 4) + payload


def startup(user: str = "fuzz") -> bytes:
    body = struct.pack(">i", 196608) + b"user\0" + user.encode() + b"\0database\0tablecast\0\0"
    return struct.pack(">i", len(body) + 4) + body


def _sql(rng: random.Random) -> str:
    return " ".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 14)))


def _cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def case(rng: random.Random) -> tuple[bytes, bool]:
    """(the bytes of one case, whether they end by asking the node to close)."""
    kind = rng.randrange(6)
    if kind == 0:  # garbage from the first byte
        return rng.randbytes(rng.randint(0, 64)), False
    if kind == 1:  # a startup packet with a random length or version
        version = rng.choice([196608, 0, 80877103, 80877102, 80877104, rng.getrandbits(31)])
        length = rng.choice([8, 4, 0, -1, 100_000, rng.randint(0, 200)])
        return struct.pack(">ii", length, version) + rng.randbytes(rng.randint(0, 40)), False
    out = startup()
    ends = False
    for _ in range(rng.randint(1, 8)):
        pick = rng.randrange(8)
        if pick == 0:  # a random type, a random payload
            kind_byte = bytes([rng.choice(TYPES)])
            out += _msg(kind_byte, rng.randbytes(rng.randint(0, 40)))
            ends |= kind_byte == b"X"  # a Terminate: the node closes without a word
        elif pick == 1:  # a length that lies
            out += bytes([rng.choice(TYPES)]) + struct.pack(">i", rng.choice([0, 3, -5, 2**31 - 1]))
        elif pick == 2:
            out += _msg(b"Q", _cstr(_sql(rng)))
        elif pick == 3:
            name = rng.choice(["", "s1", "s\xe9"])
            out += _msg(b"P", _cstr(name) + _cstr(_sql(rng)) + struct.pack(">h", 0))
        elif pick == 4:  # Bind with counts and formats of any kind
            n = rng.randint(-1, 3)
            params = b"".join(
                struct.pack(">i", len(v)) + v
                for v in (rng.randbytes(rng.randint(0, 8)) for _ in range(max(n, 0)))
            )
            payload = _cstr("") + _cstr(rng.choice(["", "s1", "nope"]))
            payload += struct.pack(">hh", 1, rng.choice([0, 1, 7]))
            payload += struct.pack(">h", n) + params + struct.pack(">hh", 1, rng.choice([0, 1, 2]))
            out += _msg(
                b"B", payload[: rng.randint(0, len(payload))] if rng.random() < 0.3 else payload
            )
        elif pick == 5:
            out += _msg(b"D", rng.choice([b"S", b"P", b"Z"]) + _cstr(rng.choice(["", "s1", "x"])))
        elif pick == 6:
            out += _msg(b"E", _cstr(rng.choice(["", "p"])) + struct.pack(">i", rng.randint(-2, 3)))
        else:
            out += _msg(b"S", b"")
    if rng.random() < 0.5:
        out += _msg(b"S", b"")
    if rng.random() < 0.3:
        out += _msg(b"X", b"")
        ends = True
    return out, ends


def _frames(data: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Backend messages in `data` (after a one-byte SSL answer, if any), and what is left."""
    out = []
    pos = 0
    while len(data) - pos >= 5:
        kind = data[pos : pos + 1]
        (length,) = struct.unpack_from(">i", data, pos + 1)
        if length < 4 or pos + 1 + length > len(data):
            break
        out.append((kind, data[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return out, data[pos:]


async def run_case(host: str, port: int, data: bytes, ends: bool, report: Report) -> None:
    report.cases += 1
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
    except ConnectionError:
        pass
    got = b""
    closed = False
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), QUIET_S)
        except TimeoutError:
            break
        except ConnectionError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        got += chunk
    writer.close()
    if got[:1] in (b"N", b"S") and data[4:8] in (
        struct.pack(">i", 80877103),
        struct.pack(">i", 80877104),
    ):
        got = got[1:]
    frames, rest = _frames(got)
    if rest:
        report.problems.append(f"a torn message at the end ({rest[:20]!r}) for {data[:60]!r}")
    errors = [p for k, p in frames if k == b"E"]
    for p in errors:
        if b"CXX000\0" in p:
            report.problems.append(f"an internal error for {data[:80]!r}: {p[:200]!r}")
    if frames:
        report.answered += 1
    if closed:
        last_error = bool(frames) and frames[-1][0] == b"E"
        cancel = data[4:8] == struct.pack(">i", 80877102) and len(data) >= 16
        if last_error:
            report.closed_with_error += 1
        elif not ends and not cancel and not _cut(data):
            report.problems.append(f"closed without an ErrorResponse after {data[:80]!r}")
    else:
        report.quiet += 1


def _cut(data: bytes) -> bool:
    """Whether the bytes asked for a connection the node may drop without a word: an SSL
    or GSS request answered "no" and then nothing, or a cancel request."""
    return len(data) >= 8 and data[4:8] in (struct.pack(">i", 80877102),)


async def fuzz(host: str, port: int, cases: int, seed: int, parallel: int = 16) -> Report:
    rng = random.Random(seed)
    report = Report()
    work = [case(rng) for _ in range(cases)]
    gate = asyncio.Semaphore(parallel)

    async def one(data: bytes, ends: bool) -> None:
        async with gate:
            await run_case(host, port, data, ends, report)

    await asyncio.gather(*(one(d, e) for d, e in work))
    return report
