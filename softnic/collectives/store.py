"""A small key-value store over TCP for the rendezvous (the role of torch's TCPStore).

Rank 0 serves it on ``MASTER_ADDR:MASTER_PORT``; every rank (rank 0 too) is a
client.  Keys are strings, values bytes.  ``get`` blocks until the key exists,
up to a timeout.  The server also watches its clients: a rank whose connection
drops without saying goodbye is recorded as failed, and every ``get`` that is
waiting (or comes later) fails at once with :class:`RankFailure` naming it,
so a crashed rank turns into an error on the others instead of a hang.

Framing: each request and reply is ``!cI`` (op, length) then a payload; keys
and values inside a payload are length-prefixed.  Nothing is unpickled.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

_HDR = struct.Struct("!cI")
_LEN = struct.Struct("!I")
_TIMEOUT = struct.Struct("!d")

OP_HELLO, OP_SET, OP_GET, OP_CHECK, OP_ADD, OP_BYE = b"H", b"S", b"G", b"C", b"A", b"B"
OK, MISSING, FAILED, TIMEOUT = b"o", b"m", b"f", b"t"


class StoreError(RuntimeError):
    """The rendezvous failed: the store is unreachable or a key never appeared."""


class StoreTimeout(StoreError):
    pass


class RankFailure(StoreError):
    """A rank's connection to the store dropped: the process died or exited early."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


def _pack(*parts: bytes) -> bytes:
    return b"".join(_LEN.pack(len(p)) + p for p in parts)


def _unpack(payload: bytes) -> list[bytes]:
    out, i = [], 0
    while i < len(payload):
        (n,) = _LEN.unpack_from(payload, i)
        out.append(payload[i + 4:i + 4 + n])
        i += 4 + n
    return out


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            raise ConnectionError("connection closed")
        buf += got
    return bytes(buf)


def _send_msg(sock, op: bytes, payload: bytes = b"") -> None:
    sock.sendall(_HDR.pack(op, len(payload)) + payload)


def _recv_msg(sock) -> tuple[bytes, bytes]:
    op, n = _HDR.unpack(_recv_exact(sock, _HDR.size))
    return op, _recv_exact(sock, n)


class StoreServer:
    """The store, served by a thread per client.  ``port=0`` picks a free port."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self._data: dict[str, bytes] = {}
        self._failed: dict[int, str] = {}
        self._cond = threading.Condition()
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self.address = self._sock.getsockname()[:2]
        self._closing = False
        self._thread = threading.Thread(target=self._accept_loop, name="softnic-store",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing = True
        self._thread.join(timeout=2)
        self._sock.close()

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _failure(self) -> bytes | None:
        if not self._failed:
            return None
        ranks = sorted(self._failed)
        return _pack(",".join(map(str, ranks)).encode(),
                     "; ".join(f"rank {r}: {self._failed[r]}" for r in ranks).encode())

    def _serve(self, conn: socket.socket) -> None:
        rank = None
        clean = False
        try:
            while True:
                op, payload = _recv_msg(conn)
                parts = _unpack(payload)
                if op == OP_HELLO:
                    rank = int(parts[0])
                    _send_msg(conn, OK)
                elif op == OP_BYE:
                    clean = True
                    _send_msg(conn, OK)
                    return
                elif op == OP_SET:
                    with self._cond:
                        self._data[parts[0].decode()] = parts[1]
                        self._cond.notify_all()
                    _send_msg(conn, OK)
                elif op == OP_ADD:
                    key = parts[0].decode()
                    with self._cond:
                        v = int(self._data.get(key, b"0")) + int(parts[1])
                        self._data[key] = str(v).encode()
                        self._cond.notify_all()
                    _send_msg(conn, OK, str(v).encode())
                elif op == OP_CHECK:
                    with self._cond:
                        have = all(k.decode() in self._data for k in parts)
                    _send_msg(conn, OK if have else MISSING)
                elif op == OP_GET:
                    key = parts[0].decode()
                    (timeout,) = _TIMEOUT.unpack(parts[1])
                    deadline = time.monotonic() + timeout
                    with self._cond:
                        while key not in self._data and not self._failed:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            self._cond.wait(min(left, 1.0))
                        value = self._data.get(key)
                        failure = self._failure()
                    if value is not None:
                        _send_msg(conn, OK, value)
                    elif failure is not None:
                        _send_msg(conn, FAILED, failure)
                    else:
                        _send_msg(conn, TIMEOUT)
                else:
                    return
        except (ConnectionError, OSError, struct.error):
            pass
        finally:
            conn.close()
            if rank is not None and not clean and not self._closing:
                with self._cond:
                    self._failed.setdefault(rank, "its connection to the store dropped "
                                                  "(the process died or exited early)")
                    self._cond.notify_all()


class StoreClient:
    """One rank's connection to the store.  Connects with retries until ``timeout``."""

    def __init__(self, host: str, port: int, rank: int, timeout: float = 60.0):
        self.host, self.port, self.rank, self.timeout = host, port, rank, timeout
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=2)
                break
            except OSError as ex:
                last = ex
                if time.monotonic() > deadline:
                    raise StoreError(f"rank {rank}: cannot reach the rendezvous store at "
                                     f"{host}:{port} within {timeout:g} s ({last}); is rank 0 "
                                     f"running with the same MASTER_ADDR/MASTER_PORT?") from None
                time.sleep(0.05)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._request(OP_HELLO, _pack(str(rank).encode()))

    def _request(self, op: bytes, payload: bytes = b"") -> tuple[bytes, bytes]:
        with self._lock:
            try:
                _send_msg(self._sock, op, payload)
                return _recv_msg(self._sock)
            except (ConnectionError, OSError) as ex:
                raise RankFailure(f"rank {self.rank}: lost the rendezvous store at "
                                  f"{self.host}:{self.port} ({ex}); rank 0 has probably "
                                  f"exited", [0]) from None

    def set(self, key: str, value: bytes | str) -> None:
        if isinstance(value, str):
            value = value.encode()
        self._request(OP_SET, _pack(key.encode(), value))

    def add(self, key: str, amount: int) -> int:
        return int(self._request(OP_ADD, _pack(key.encode(), str(amount).encode()))[1])

    def check(self, keys: list[str]) -> bool:
        return self._request(OP_CHECK, _pack(*(k.encode() for k in keys)))[0] == OK

    def get(self, key: str, timeout: float | None = None) -> bytes:
        timeout = self.timeout if timeout is None else timeout
        status, payload = self._request(OP_GET, _pack(key.encode(), _TIMEOUT.pack(timeout)))
        if status == OK:
            return payload
        if status == FAILED:
            ranks, text = _unpack(payload)
            raise RankFailure(f"rank {self.rank}: {text.decode()}",
                              [int(r) for r in ranks.decode().split(",")])
        raise StoreTimeout(f"rank {self.rank}: key {key!r} did not appear within {timeout:g} s")

    def failed_ranks(self) -> list[int]:
        """Ranks whose store connection dropped (asks with a zero wait)."""
        try:
            self.get("__softnic_no_such_key__", timeout=0)
        except RankFailure as ex:
            return ex.ranks
        except StoreTimeout:
            pass
        return []

    def close(self) -> None:
        try:
            self._request(OP_BYE)
        except StoreError:
            pass
        self._sock.close()
