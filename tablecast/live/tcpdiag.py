"""How far each client of a listening port has read: the kernel's TCP counters (Linux sock_diag).

granian's streamed responses take every write at once, so a client that stops
reading makes the node buffer without bound, and nothing in the HTTP layer
says so. The kernel knows: ``tcpi_bytes_acked`` of a connection counts the
bytes its client has acknowledged. One netlink dump (what ``ss -ti`` does)
gives it for every connection of the port, without a file descriptor per
socket; the hub compares it with what each stream handed over.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_DONE = 3
NLMSG_ERROR = 2
TCP_ESTABLISHED = 1
INET_DIAG_INFO = 2
INET_DIAG_REQ_BYTECODE = 1
INET_DIAG_BC_S_GE = 2
INET_DIAG_BC_S_LE = 3

_NLMSGHDR = struct.Struct("=IHHII")
#: family, protocol, extensions wanted, pad, states; then the socket id (ports big-endian)
_REQ = struct.Struct("=BBBxI")
_SOCKID = struct.Struct(">HH16s16sI8s")
_MSG = struct.Struct("=BBBB")  # family, state, timer, retrans (then the socket id)
_RTA = struct.Struct("=HH")
#: offset of tcpi_bytes_acked in struct tcp_info (Linux >= 4.1)
_BYTES_ACKED = 120
_U64 = struct.Struct("=Q")
_V4_MAPPED = bytes(10) + b"\xff\xff"


def _request(family: int, port: int) -> bytes:
    # the kernel keeps only sockets whose local port is `port` (sport >= port and <= port)
    ops = struct.pack("=BBH", INET_DIAG_BC_S_GE, 8, 20) + struct.pack("=BBH", 0, 0, port)
    ops += struct.pack("=BBH", INET_DIAG_BC_S_LE, 8, 12) + struct.pack("=BBH", 0, 0, port)
    attr = _RTA.pack(_RTA.size + len(ops), INET_DIAG_REQ_BYTECODE) + ops
    body = (
        _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 1 << TCP_ESTABLISHED)
        + bytes(_SOCKID.size)
        + attr
    )
    return (
        _NLMSGHDR.pack(
            _NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
        )
        + body
    )


def acked(port: int) -> dict[tuple[str, int], int]:
    """(client address, client port) -> bytes it has acknowledged, for every established
    connection to local `port` (IPv4 and IPv6). OSError where sock_diag is not available."""
    out: dict[tuple[str, int], int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as s:
        for family in (socket.AF_INET, socket.AF_INET6):
            s.send(_request(family, port))
            _read_dump(s, family, out)
    return out


def _read_dump(s: socket.socket, family: int, out: dict[tuple[str, int], int]) -> None:
    width = 4 if family == socket.AF_INET else 16
    ntop = socket.inet_ntop
    unpack_id, unpack_rta, unpack_hdr = _SOCKID.unpack_from, _RTA.unpack_from, _NLMSGHDR.unpack_from
    acked_at = _RTA.size + _BYTES_ACKED
    while True:
        data = s.recv(1 << 20)
        at = 0
        while at + _NLMSGHDR.size <= len(data):
            length, kind, _, _, _ = unpack_hdr(data, at)
            if length < _NLMSGHDR.size or kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", data, at + _NLMSGHDR.size)
                if code:
                    raise OSError(-code, "sock_diag refused the request")
                return
            msg = at + _NLMSGHDR.size
            _, dport, _, dst, _, _ = unpack_id(data, msg + _MSG.size)
            # after the socket id: expires, rqueue, wqueue, uid, inode
            attrs = msg + _MSG.size + _SOCKID.size + 20
            end = at + length
            while attrs + _RTA.size <= end:
                rta_len, rta_type = unpack_rta(data, attrs)
                if rta_len < _RTA.size:
                    break
                if rta_type == INET_DIAG_INFO and rta_len >= acked_at + 8:
                    (got,) = _U64.unpack_from(data, attrs + acked_at)
                    raw = dst[:width]
                    if width == 16 and raw[:12] == _V4_MAPPED:
                        address = ntop(socket.AF_INET, raw[12:])
                    else:
                        address = ntop(family, raw)
                    out[(address, dport)] = got
                attrs += (rta_len + 3) & ~3
            at += (length + 3) & ~3


def peer_of(client: str) -> tuple[str, int] | None:
    """granian's ``scope.client`` ("1.2.3.4:5678", "[::1]:5678") as (address, port)."""
    host, sep, port = client.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return str(address), int(port)
