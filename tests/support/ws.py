"""A minimal WebSocket client (RFC 6455) for tests: the handshake, text frames in, a close out.
Enough to read a watch; written here so the tests need no WebSocket library."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import socket
import struct
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class WebSocket:
    def __init__(
        self,
        url: str,
        params: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16))
        target = parts.path + ("?" + urlencode(params, doseq=True) if params else "")
        head = [
            f"GET {target} HTTP/1.1",
            f"host: {parts.hostname}:{parts.port}",
            "upgrade: websocket",
            "connection: Upgrade",
            f"sec-websocket-key: {key.decode()}",
            "sec-websocket-version: 13",
            *(f"{k}: {v}" for k, v in (headers or {}).items()),
        ]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        self._buf = b""
        status_line, response_headers = self._read_head()
        self.status = int(status_line.split()[1])
        if self.status == 101:
            accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
            assert response_headers.get("sec-websocket-accept") == accept, response_headers

    def _read_head(self) -> tuple[str, dict[str, str]]:
        while b"\r\n\r\n" not in self._buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            self._buf += chunk
        head, self._buf = self._buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        return lines[0], {k.lower(): v for k, v in fields.items()}

    def _exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def receive(self) -> dict[str, Any] | None:
        """The next text message as JSON; None when the server closed."""
        while True:
            b0, b1 = self._exact(2)
            opcode, length = b0 & 0x0F, b1 & 0x7F
            if length == 126:
                (length,) = struct.unpack(">H", self._exact(2))
            elif length == 127:
                (length,) = struct.unpack(">Q", self._exact(8))
            payload = self._exact(length)
            if opcode == 0x8:
                return None
            if opcode == 0x1:
                return orjson.loads(payload)
            if opcode == 0x9:  # ping: answer it
                self._send(0xA, payload)

    def close_code(self) -> int | None:
        """The code of the server's next close frame, frames before it skipped (None: the
        connection ended without one)."""
        try:
            while True:
                b0, b1 = self._exact(2)
                length = b1 & 0x7F
                if length == 126:
                    (length,) = struct.unpack(">H", self._exact(2))
                payload = self._exact(length)
                if b0 & 0x0F == 0x8:
                    return int(struct.unpack(">H", payload[:2])[0])
        except OSError:  # ConnectionError among them
            return None

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        n = len(payload)
        size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
        self.sock.sendall(bytes([0x80 | opcode]) + size + mask + masked)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._send(0x8, struct.pack(">H", 1000))
        self.sock.close()
