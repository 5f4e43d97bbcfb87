"""Real TCP sockets for iWARP devices: the only place that touches them.

A device with ``transport=tcp`` listens on TCP at its own (IPv4, port) and
opens one connection per connected QP pair (``IwarpDevice`` decides which end
connects).  Everything is non-blocking; ``TcpTransport.step`` does all that
can be done without waiting (accept, finish connects, read, write what is
queued) and hands the engine what happened.  Outgoing connections bind the
device's own IPv4 address, so the peer sees which device is calling.
"""

from __future__ import annotations

import errno
import select
import socket

Address = tuple[str, int]
RECV_SIZE = 1 << 18
_GONE = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, TimeoutError)


class TcpTransport:
    def __init__(self, ip: str, port: int, *, backlog: int = 128):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((ip, port))
            s.listen(backlog)
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self.listener = s
        self.address: Address = s.getsockname()
        self.socks: dict[int, socket.socket] = {}       # cid -> connection
        self.out: dict[int, bytearray] = {}             # cid -> bytes the kernel has not taken
        self.connecting: set[int] = set()
        self.ends: dict[int, tuple[Address, Address]] = {}   # cid -> (local, peer)
        self.send_errors = 0

    # ------------------------------------------------------------ engine requests

    def connect(self, cid: int, addr: Address) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            s.bind((self.address[0], 0))
        except OSError:
            pass                                       # fall back to any local address
        s.connect_ex(addr)              # a failure shows as SO_ERROR once writable
        self.socks[cid] = s
        self.out[cid] = bytearray()
        self.connecting.add(cid)

    def send(self, cid: int, data: bytes) -> None:
        buf = self.out.get(cid)
        if buf is None:
            return
        buf += data
        if cid not in self.connecting:
            self._write(cid)

    def close(self, cid: int) -> None:
        s = self.socks.pop(cid, None)
        self.out.pop(cid, None)
        self.connecting.discard(cid)
        self.ends.pop(cid, None)
        if s is not None:
            try:
                s.close()
            except OSError:
                pass

    def backlog(self) -> int:
        """Bytes queued here that the kernel has not taken yet."""
        return max((len(b) for b in self.out.values()), default=0)

    # ------------------------------------------------------------ progress

    def step(self, dev, now: float, on_tx=None, on_rx=None) -> bool:
        """Accept, complete connects, read and write without blocking.  Returns
        True if anything happened.  ``on_tx``/``on_rx(cid, data)`` see the bytes."""
        did = False
        while True:                                          # new connections
            try:
                s, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cid = dev.connection_accepted(peer)
            self.socks[cid] = s
            self.out[cid] = bytearray()
            self.ends[cid] = (s.getsockname(), peer)
            did = True
        if self.connecting:
            _, w, _ = select.select([], [self.socks[c] for c in self.connecting], [], 0)
            for cid in list(self.connecting):
                s = self.socks[cid]
                if s not in w:
                    continue
                self.connecting.discard(cid)
                did = True
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    self.close(cid)
                    dev.connection_lost(cid, now)
                    continue
                self.ends[cid] = (s.getsockname(), s.getpeername())
                dev.connection_made(cid, now)
        for cid, s in list(self.socks.items()):
            if cid in self.connecting:
                continue
            for _ in range(64):
                try:
                    data = s.recv(RECV_SIZE)
                except (BlockingIOError, InterruptedError):
                    break
                except _GONE:
                    data = b""
                except OSError:
                    data = b""
                did = True
                if not data:
                    self.close(cid)
                    dev.connection_lost(cid, now)
                    break
                if on_rx is not None:
                    on_rx(cid, data)
                dev.receive_stream(cid, data, now)
                if len(data) < RECV_SIZE:
                    break
        return did

    def flush(self, dev, now: float, on_tx=None, budget: int = 1 << 22) -> None:
        """Hand the kernel what the engine produced, then what was queued before;
        close what the engine is done with last, so a final Terminate goes out."""
        for cid, addr in dev.connections_to_open():
            self.connect(cid, addr)
        room = budget - self.backlog()
        for cid, data in dev.stream_data_to_send(now, room):
            if on_tx is not None and cid in self.ends:
                on_tx(cid, data)
            self.send(cid, data)
        for cid in list(self.out):
            if self.out[cid] and cid not in self.connecting:
                self._write(cid)
        for cid in dev.connections_to_close():
            self.close(cid)

    def _write(self, cid: int) -> None:
        buf = self.out[cid]
        s = self.socks[cid]
        while buf:
            try:
                n = s.send(buf)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.send_errors += 1
                buf.clear()                 # the read side reports the connection lost
                return
            del buf[:n]

    def watched(self) -> tuple:
        """What ``wait`` watches: the connections, those connecting, those with
        output queued.  A caller that changes it while a thread waits rings that
        thread's bell (the thread then watches afresh)."""
        return (frozenset(self.socks), frozenset(self.connecting),
                frozenset(c for c, b in tuple(self.out.items()) if b))

    def wait(self, timeout: float | None, bell: int | None = None) -> int:
        """Block until a socket is readable (or a queued write can go), ``bell`` (a
        descriptor) is readable, or ``timeout``.  1: a socket; 2: the bell; 0: time
        is up."""
        # The progress thread waits here without the device lock, while a verbs call may
        # open or close a connection: take copies (each made in one step under the
        # interpreter lock) rather than iterate the live dict and set.  What it watches
        # is noted first: a change after that is one the caller rings for.
        self.watching = self.watched()
        socks = dict(self.socks)
        connecting = frozenset(self.connecting)
        out = tuple((c, bool(b)) for c, b in tuple(self.out.items()))
        r = [self.listener] + [s for c, s in socks.items() if c not in connecting]
        if bell is not None:
            r.append(bell)
        w = [socks[c] for c in connecting if c in socks] + \
            [socks[c] for c, b in out if b and c not in connecting and c in socks]
        try:
            rr, ww, _ = select.select(r, w, [], timeout)
        except ValueError:
            return 0
        if bell is not None and bell in rr:
            return 2
        return 1 if rr or ww else 0

    def fileno(self) -> int:
        return self.listener.fileno()

    def close_all(self) -> None:
        for cid in list(self.socks):
            self.close(cid)
        self.listener.close()


def bind_free_tcp(ips: list[str], port: int) -> TcpTransport:
    """Listen on the first of ``ips`` whose TCP ``port`` is free."""
    last = None
    for ip in ips:
        try:
            return TcpTransport(ip, port)
        except OSError as e:
            if e.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise
            last = e
    raise OSError(errno.EADDRINUSE, f"no free address for TCP port {port}: {last}")
