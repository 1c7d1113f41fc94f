"""The node's gRPC server (HTTP/2 on the event loop), asked by grpcio's client as any gRPC
user's program would: unary, streaming and per-message calls, statuses, deadlines, flow
control past the windows, TLS, and peers that break the protocol."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from hpack import Encoder

from tablecast.grpc import http2
from tablecast.grpc.header_blocks import Decoder
from tablecast.grpc.http2 import (
    MAX_FRAME,
    PREFACE,
    Call,
    GrpcError,
    Kind,
    Method,
    Server,
    Status,
    frame,
)
from tablecast.kafka.broker import free_port
from tablecast.kafka.secure import make_certificates

closed: list[str] = []


def _echo(request: bytes, call: Call) -> bytes:
    return request + call.metadata.get("x-extra", "").encode()


async def _later(request: bytes, call: Call) -> bytes:
    await asyncio.sleep(float(request))
    return b"late"


def _fail(request: bytes, call: Call) -> bytes:
    raise GrpcError(
        Status.PERMISSION_DENIED, "nicht erlaubt: ü 100%", (("tablecast-error", "forbidden"),)
    )


def _boom(request: bytes, call: Call) -> bytes:
    raise ValueError("a bug")


def _big(request: bytes, call: Call) -> bytes:
    return b"x" * int(request)


async def _count(request: bytes, call: Call) -> AsyncIterator[bytes]:
    try:
        for i in range(int(request)):
            yield str(i).encode()
            await asyncio.sleep(0)
        if int(request) == 0:
            await asyncio.sleep(60)  # held open until the client goes
    finally:
        closed.append(request.decode())


def _reverse(request: bytes, call: Call) -> bytes:
    return request[::-1] * 100  # an answer much larger than its request


def _long_failure(request: bytes, call: Call) -> bytes:
    raise GrpcError(Status.NOT_FOUND, "é" * 20_000)


def _strict(body: bytes) -> int:
    return int(body)


def _size(request: int, call: Call) -> bytes:
    return str(request).encode()


def _same(body: bytes) -> bytes:
    return body


METHODS = {
    "/t.T/Echo": Method(Kind.UNARY, _same, _echo),
    "/t.T/Later": Method(Kind.UNARY, _same, _later),
    "/t.T/Fail": Method(Kind.UNARY, _same, _fail),
    "/t.T/Boom": Method(Kind.UNARY, _same, _boom),
    "/t.T/Big": Method(Kind.UNARY, _same, _big),
    "/t.T/Count": Method(Kind.STREAM, _same, _count),
    "/t.T/Each": Method(Kind.EACH, _same, _reverse),
    "/t.T/Strict": Method(Kind.UNARY, _strict, _size),
    "/t.T/Long": Method(Kind.UNARY, _same, _long_failure),
}


def _serve(test: Callable[[int], Awaitable[Any]], tls: tuple[str, str] | None = None) -> Any:
    async def main() -> Any:
        server = Server(METHODS)
        port = free_port()
        await server.start("127.0.0.1", port, tls)
        try:
            return await test(port)
        finally:
            await server.stop(0.5)

    return asyncio.run(main())


def _unary(channel: grpc.aio.Channel, name: str) -> Any:
    return channel.unary_unary(f"/t.T/{name}")


def test_unary_streaming_and_per_message_calls_answer() -> None:
    closed.clear()

    async def test(port: int) -> Any:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = await _unary(channel, "Echo")(b"abc", metadata=(("x-extra", "!"),))
            late = await _unary(channel, "Later")(b"0.05", timeout=5)
            many = [m async for m in channel.unary_stream("/t.T/Count")(b"5")]
            each = channel.stream_stream("/t.T/Each")
            call = each()
            answers = []
            for word in (b"one", b"two", b"three"):
                await call.write(word)
                answers.append(await call.read())  # each answered before the next is sent
            await call.done_writing()
            assert await call.read() == grpc.aio.EOF
            # many calls at once on one connection, more than the streams it allows
            calls = await asyncio.gather(
                *(_unary(channel, "Echo")(str(i).encode()) for i in range(300))
            )
            return echo, late, many, answers, calls

    echo, late, many, answers, calls = _serve(test)
    assert echo == b"abc!" and late == b"late"
    assert many == [b"0", b"1", b"2", b"3", b"4"]
    assert answers == [b"eno" * 100, b"owt" * 100, b"eerht" * 100]
    assert calls == [str(i).encode() for i in range(300)]
    assert closed == ["5"]


def test_errors_come_as_grpc_statuses() -> None:
    async def test(port: int) -> Any:
        out = {}
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            for name, request, kw in (
                ("Fail", b"", {}),
                ("Boom", b"", {}),
                ("Nothing", b"", {}),
                ("Strict", b"not a number", {}),
                ("Later", b"5", {"timeout": 0.2}),
            ):
                try:
                    await _unary(channel, name)(request, **kw)
                except grpc.aio.AioRpcError as e:
                    out[name] = (e.code(), e.details(), dict(e.trailing_metadata() or ()))
            out["Strict-ok"] = await _unary(channel, "Strict")(b"41")
        return out

    out = _serve(test)
    assert out["Fail"] == (
        grpc.StatusCode.PERMISSION_DENIED,
        "nicht erlaubt: ü 100%",
        {"tablecast-error": "forbidden"},
    )
    assert out["Boom"][0] == grpc.StatusCode.INTERNAL and "a bug" not in out["Boom"][1]
    assert out["Nothing"][0] == grpc.StatusCode.UNIMPLEMENTED
    assert out["Strict"][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert out["Later"][0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert out["Strict-ok"] == b"41"


def test_messages_larger_than_the_windows_and_frames_go_both_ways() -> None:
    big = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB: past every window and frame size

    async def test(port: int) -> Any:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=(("grpc.max_receive_message_length", 8 << 20),)
        ) as channel:
            sent = await _unary(channel, "Echo")(big)
            answers = await asyncio.gather(*(_unary(channel, "Big")(b"3000000") for _ in range(4)))
            try:
                await _unary(channel, "Echo")(b"y" * (5 << 20))
            except grpc.aio.AioRpcError as e:
                too_big = e.code()
            return sent, answers, too_big

    sent, answers, too_big = _serve(test)
    assert sent == big
    assert answers == [b"x" * 3_000_000] * 4
    assert too_big == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_client_that_goes_away_ends_its_stream() -> None:
    closed.clear()

    async def test(port: int) -> Any:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream("/t.T/Count")(b"0")
            await asyncio.sleep(0.2)
            call.cancel()
        for _ in range(100):
            if closed:
                break
            await asyncio.sleep(0.02)
        return list(closed)

    assert _serve(test) == ["0"]


def test_calls_over_tls(tmp_path: Path) -> None:
    ca, chain = make_certificates(["127.0.0.1"])
    (tmp_path / "node.pem").write_text(chain)

    async def test(port: int) -> Any:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.encode())
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
            return await _unary(channel, "Echo")(b"secret")

    pem = str(tmp_path / "node.pem")
    assert _serve(test, (pem, pem)) == b"secret"


def _raw(port: int, data: bytes) -> bytes:
    """What the server sends back to a raw connection that sends `data`, until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except TimeoutError:
            pass
        return got


def _goaway_code(answer: bytes) -> int | None:
    at = 0
    while at + 9 <= len(answer):
        length = int.from_bytes(answer[at : at + 3], "big")
        kind = answer[at + 3]
        if kind == 7:
            return int.from_bytes(answer[at + 13 : at + 17], "big")
        at += 9 + length
    return None


def test_peers_that_break_the_protocol_are_cut_off_and_others_go_on() -> None:
    async def test(port: int) -> Any:
        loop = asyncio.get_running_loop()
        not_h2 = await loop.run_in_executor(None, _raw, port, b"GET / HTTP/1.1\r\n\r\n")
        settings = frame(4, 0, 0)
        huge = await loop.run_in_executor(
            None,
            _raw,
            port,
            PREFACE
            + settings
            + struct.pack(">HBBBL", (MAX_FRAME + 1) >> 8, (MAX_FRAME + 1) & 0xFF, 0, 0, 1),
        )
        bad_block = await loop.run_in_executor(
            None, _raw, port, PREFACE + settings + frame(1, 0x5, 1, b"\xff\xff\xff\xff\xff\xff")
        )
        cut_short = await loop.run_in_executor(
            None, _raw, port, PREFACE + settings + frame(1, 0x5, 1, b"\x00")
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            still = await _unary(channel, "Echo")(b"fine")
        return not_h2, huge, bad_block, cut_short, still

    not_h2, huge, bad_block, cut_short, still = _serve(test)
    assert _goaway_code(cut_short) == 9  # COMPRESSION_ERROR, not a crash
    assert _goaway_code(not_h2) is None  # closed: not even a GOAWAY for what is not HTTP/2
    assert _goaway_code(huge) == 6  # FRAME_SIZE_ERROR
    assert _goaway_code(bad_block) == 9  # COMPRESSION_ERROR
    assert still == b"fine"


@pytest.mark.parametrize("grace", [0.0, 1.0])
def test_stopping_ends_streams_and_refuses_new_calls(grace: float) -> None:
    closed.clear()

    async def main() -> Any:
        server = Server(METHODS)
        port = free_port()
        await server.start("127.0.0.1", port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream("/t.T/Count")(b"0")
            await asyncio.sleep(0.2)
            await server.stop(grace)
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in call:
                    pass
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _unary(channel, "Echo")(b"x", timeout=2)
        return refused.value.code()

    assert asyncio.run(main()) in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert closed == ["0"]


class RawH2:
    """A client speaking HTTP/2 frame by frame, to say what no well-behaved library says."""

    def __init__(self, port: int, settings: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.sendall(PREFACE + frame(4, 0, 0, settings))
        self.encoder, self.decoder = Encoder(), Decoder()
        self.buf = b""

    def call(self, sid: int, path: str, body: bytes, **metadata: str) -> None:
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path),
                  (":authority", "x"), ("content-type", "application/grpc"),
                  *metadata.items()]  # fmt: skip
        self.sock.sendall(
            frame(1, 0x4, sid, self.encoder.encode(fields))
            + frame(0, 0x1, sid, http2.message(body))
        )

    def frames(
        self, until: Callable[[int, int, int, bytes], bool]
    ) -> list[tuple[int, int, int, bytes]]:
        """Frames (type, flags, stream, payload) until one satisfies `until` or the server
        closes; header blocks come decoded into their payload's place as a repr."""
        got = []
        while True:
            while len(self.buf) >= 9 and len(self.buf) >= 9 + int.from_bytes(self.buf[:3], "big"):
                n = int.from_bytes(self.buf[:3], "big")
                kind, flags, sid = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big")
                payload, self.buf = self.buf[9 : 9 + n], self.buf[9 + n :]
                if kind == 1:
                    payload = repr(self.decoder.decode(payload)).encode()
                got.append((kind, flags, sid, payload))
                if until(kind, flags, sid, payload):
                    return got
            chunk = self.sock.recv(65536)
            if not chunk:
                return got
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def _ended(sid: int) -> Callable[[int, int, int, bytes], bool]:
    return lambda kind, flags, s, _: s == sid and (kind == 3 or (kind == 1 and flags & 1))


def test_a_header_with_a_line_break_resets_its_stream_only() -> None:
    async def test(port: int) -> Any:
        def run() -> Any:
            raw = RawH2(port)
            raw.call(1, "/t.T/Echo", b"x", **{"x-tablecast-after": "a\r\nx-evil: 1"})
            first = raw.frames(_ended(1))
            raw.call(3, "/t.T/Echo", b"y", **{"grpc-timeout": "\u00b2S"})  # no ASCII digit
            second = raw.frames(_ended(3))
            raw.close()
            return first, second

        return await asyncio.get_running_loop().run_in_executor(None, run)

    first, second = _serve(test)
    assert first[-1][0] == 3 and int.from_bytes(first[-1][3], "big") == 1  # PROTOCOL_ERROR
    assert b"grpc-status', '0'" in second[-1][3]  # answered: the timeout is none


def test_answers_a_client_does_not_take_are_bounded() -> None:
    async def test(port: int) -> Any:
        def run() -> Any:
            raw = RawH2(port, struct.pack(">HL", 4, 0))  # no window for our answers
            raw.sock.sendall(
                frame(1, 0x4, 1, raw.encoder.encode([(":method", "POST"), (":scheme", "http"),
                      (":path", "/t.T/Each"), (":authority", "x"),
                      ("content-type", "application/grpc")]))
            )  # fmt: skip
            data = http2.message(b"0123456789") * 1400  # 21 KB asking 1.4 MB of answers
            for at in range(0, len(data), 16_000):
                raw.sock.sendall(frame(0, 0, 1, data[at : at + 16_000]))
            got = raw.frames(_ended(1))
            raw.close()
            return got

        return await asyncio.get_running_loop().run_in_executor(None, run)

    got = _serve(test)
    assert b"grpc-status', '8'" in got[-1][3] or got[-1][0] == 3


def test_a_long_error_message_is_cut_and_the_channel_goes_on() -> None:
    async def test(port: int) -> Any:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await _unary(channel, "Long")(b"")
            return failed.value, await _unary(channel, "Echo")(b"after")

    failed, after = _serve(test)
    assert failed.code() == grpc.StatusCode.NOT_FOUND
    assert 0 < len(failed.details()) <= 600 and after == b"after"


def test_a_smaller_header_table_is_announced_and_a_silent_peer_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http2, "PREFACE_TIMEOUT_S", 0.3)

    async def test(port: int) -> Any:
        def run() -> Any:
            raw = RawH2(port, struct.pack(">HL", 1, 0))  # HEADER_TABLE_SIZE 0
            raw.frames(lambda kind, flags, *_: kind == 4 and flags & 1)  # our ACK
            raw.call(1, "/t.T/Echo", b"x")
            got = raw.frames(_ended(1))
            raw.close()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
                closed = silent.recv(100) is not None  # our SETTINGS, then the close
                while silent.recv(100):
                    pass
            return got, closed

        return await asyncio.get_running_loop().run_in_executor(None, run)

    got, closed = _serve(test)
    headers = [payload for kind, _, sid, payload in got if kind == 1 and sid == 1]
    assert headers and b"grpc-status', '0'" in headers[-1]
    assert closed


def test_calls_are_counted_by_method_and_status() -> None:
    async def main() -> Any:
        server = Server(METHODS)
        port = free_port()
        await server.start("127.0.0.1", port)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                for name in ("Echo", "Echo", "Fail", "Nothing"):
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await _unary(channel, name)(b"x")
                open_now = len(server.connections)
        finally:
            await server.stop(0.5)
        families = {f.name: f for f in server.collect()}
        return families, open_now

    families, open_now = asyncio.run(main())
    handled = {
        (s.labels["grpc_method"], s.labels["grpc_code"]): s.value
        for s in families["tablecast_grpc_server_handled"].samples
    }
    assert handled == {
        ("Echo", "OK"): 2,
        ("Fail", "PERMISSION_DENIED"): 1,
        ("unknown", "UNIMPLEMENTED"): 1,
    }
    assert open_now == 1


def test_compressed_requests_are_inflated_and_bounded() -> None:
    """grpcio's client compressing its messages (gzip, deflate) is answered as any other;
    an encoding the server lacks is UNIMPLEMENTED naming the ones it takes, and a message
    that inflates past 4 MiB, one that does not inflate or a compressed one with no
    encoding end that call only."""
    text = b"tablecast " * 10_000  # 100 KB that compress well

    async def test(port: int) -> Any:
        got = []
        for how in (grpc.Compression.Gzip, grpc.Compression.Deflate):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", compression=how) as ch:
                got.append(await _unary(ch, "Echo")(text, timeout=5))
                each = ch.stream_stream("/t.T/Each")
                got.append([m async for m in each(iter([b"ab", b"cd"]), timeout=5)])

        def run() -> Any:
            raw = RawH2(port)
            answers = []
            bomb = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
            gz = bomb.compress(b"\0" * (5 << 20)) + bomb.flush()
            cases = [
                (gz, {"grpc-encoding": "gzip"}),
                (b"not zlib at all", {"grpc-encoding": "deflate"}),
                (zlib.compress(b"x"), {"grpc-encoding": "snappy"}),
                (zlib.compress(b"x"), {}),
                (zlib.compress(b"whole")[:-3], {"grpc-encoding": "deflate"}),
            ]
            for i, (body, metadata) in enumerate(cases):
                sid = 2 * i + 1
                compressed = b"\x01" + len(body).to_bytes(4, "big") + body
                fields = [(":method", "POST"), (":scheme", "http"), (":path", "/t.T/Echo"),
                          (":authority", "x"), ("content-type", "application/grpc"),
                          *metadata.items()]  # fmt: skip
                raw.sock.sendall(
                    frame(1, 0x4, sid, raw.encoder.encode(fields))
                    + b"".join(
                        frame(0, 0x1 if at + MAX_FRAME >= len(compressed) else 0, sid, part)
                        for at in range(0, len(compressed), MAX_FRAME)
                        if (part := compressed[at : at + MAX_FRAME])
                    )
                )
                answers.append(raw.frames(_ended(sid))[-1][3])
            raw.call(99, "/t.T/Echo", b"still here")  # the connection goes on
            answers.append(b"".join(p for k, _, s, p in raw.frames(_ended(99)) if k == 0))
            raw.close()
            return answers

        return got, await asyncio.get_running_loop().run_in_executor(None, run)

    (gz, gz_each, deflate, deflate_each), raw = _serve(test)
    assert gz == deflate == text
    assert gz_each == deflate_each == [b"ba" * 100, b"dc" * 100]
    bomb, corrupt, unknown, unnamed, cut, after = raw
    assert b"grpc-status', '8'" in bomb  # RESOURCE_EXHAUSTED
    assert b"grpc-status', '13'" in corrupt and b"inflate" in corrupt
    assert b"grpc-status', '12'" in unknown  # UNIMPLEMENTED, with what is accepted
    assert b"('grpc-accept-encoding', 'gzip,deflate,identity')" in unknown
    assert b"grpc-status', '13'" in unnamed and b"no grpc-encoding" in unnamed
    assert b"grpc-status', '13'" in cut and b"cut short" in cut
    assert after.endswith(b"still here")
