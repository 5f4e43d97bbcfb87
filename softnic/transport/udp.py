"""Real UDP sockets: the only place that sends and receives datagrams.

One non-blocking socket per device, bound to the device's (IPv4, port).
``recv_batch`` drains what the kernel holds without blocking; ``wait``
blocks until the socket is readable or a timeout passes.
"""

from __future__ import annotations

import errno
import select
import socket

Address = tuple[str, int]
MAX_DATAGRAM = 65535
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
ECT0 = 0x02                 # ECN-capable transport, codepoint 10


class UdpSocket:
    def __init__(self, ip: str, port: int, *, rcvbuf: int = 8 << 20, sndbuf: int = 8 << 20):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            s.bind((ip, port))
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self.sock = s
        self.address: Address = s.getsockname()
        self.send_errors = 0

    def enable_ecn(self, *, send_ect: bool) -> None:
        """Read each datagram's ECN codepoint (``recv_batch_ecn``); with
        ``send_ect``, mark what this socket sends ECN-capable (ECT(0)), so an
        ECN-marking router sets CE instead of dropping."""
        s = self.sock
        try:
            s.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
            if send_ect:
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ECT0)
        except OSError as e:
            raise OSError(e.errno, f"cannot enable ECN on this socket: {e.strerror}") from None

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, data: bytes, addr: Address) -> None:
        try:
            self.sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            self.send_errors += 1        # the socket buffer is full: the packet is lost, as on a wire
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH,
                           errno.EMSGSIZE, errno.EPERM):
                self.send_errors += 1
            else:
                raise

    def recv_batch(self, limit: int = 256) -> list[tuple[bytes, Address]]:
        out = []
        recv = self.sock.recvfrom
        for _ in range(limit):
            try:
                data, addr = recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:   # an ICMP error for an earlier send
                continue
            out.append((data, addr))
        return out

    def recv_batch_ecn(self, limit: int = 256) -> list[tuple[bytes, Address, int]]:
        """Like ``recv_batch``, with each datagram's IP ECN codepoint (0-3)."""
        out = []
        recv = self.sock.recvmsg
        space = socket.CMSG_SPACE(4)
        tos_type = socket.IP_TOS
        ipproto = socket.IPPROTO_IP
        for _ in range(limit):
            try:
                data, anc, _flags, addr = recv(MAX_DATAGRAM, space)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:
                continue
            ecn = 0
            for level, typ, cdata in anc:
                if level == ipproto and typ == tos_type and cdata:
                    ecn = cdata[0] & 3
            out.append((data, addr, ecn))
        return out

    def wait(self, timeout: float | None) -> bool:
        """Block until readable or ``timeout`` seconds pass; True if readable."""
        r, _, _ = select.select([self.sock], [], [], timeout)
        return bool(r)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def bind_free(ips: list[str], port: int) -> UdpSocket:
    """Bind the first of ``ips`` whose ``port`` is free."""
    last = None
    for ip in ips:
        try:
            return UdpSocket(ip, port)
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise
            last = e
    raise OSError(errno.EADDRINUSE, f"no free address for port {port}: {last}")
