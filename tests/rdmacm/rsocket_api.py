"""rsocket calls through softnic's librdmacm.so.1, both ends in this process.

Run under ``softnic exec --devices softnic0=A,softnic1=B`` with A and B as argv[1:3]:
a listener on A, a client from B; rpoll and rselect with a pipe's fd among the
rsockets; non-blocking connect and calls, MSG_PEEK, MSG_WAITALL, shutdown's end of
stream, a refused connect, and the errors of bad descriptors.  Prints ``ok`` last;
any failed check raises.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import socket
import struct
import sys
import time

lib = ctypes.CDLL("librdmacm.so.1", use_errno=True)
for name in ("rrecv", "rsend"):
    getattr(lib, name).restype = ctypes.c_ssize_t
    getattr(lib, name).argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

POLLIN, POLLOUT, POLLERR, POLLHUP = select.POLLIN, select.POLLOUT, select.POLLERR, select.POLLHUP
SOL_SOCKET, SO_ERROR, SO_REUSEADDR = socket.SOL_SOCKET, socket.SO_ERROR, socket.SO_REUSEADDR
F_GETFL, F_SETFL, O_NONBLOCK = 3, 4, os.O_NONBLOCK
MSG_PEEK, MSG_DONTWAIT, MSG_WAITALL = socket.MSG_PEEK, socket.MSG_DONTWAIT, socket.MSG_WAITALL


class PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]


def sockaddr(ip: str, port: int) -> bytes:
    return struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(ip) \
        + bytes(8)


def check(r, what):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return r


def fails(errno_, fn, *args):
    r = fn(*args)
    e = ctypes.get_errno()
    assert r == -1 and e == errno_, f"{fn.__name__}{args[:1]}: {r}, errno {e} (want {errno_})"


def rpoll(pairs, timeout):
    arr = (PollFd * len(pairs))(*[PollFd(fd, ev, 0) for fd, ev in pairs])
    n = check(lib.rpoll(arr, len(pairs), timeout), "rpoll")
    return n, [p.revents for p in arr]


def send(fd, data: bytes, flags=0):
    return check(lib.rsend(fd, data, len(data), flags), "rsend")


def recv(fd, n, flags=0):
    buf = ctypes.create_string_buffer(n)
    got = check(lib.rrecv(fd, buf, n, flags), "rrecv")
    return buf.raw[:got]


def main(a: str, b: str) -> None:
    port = 7400 + os.getpid() % 500
    # ---------------------------------------------------------------- errors
    fails(errno.EBADF, lib.rsend, 12345, b"x", 1, 0)
    fails(errno.EBADF, lib.rclose, -1)
    fails(errno.EAFNOSUPPORT, lib.rsocket, socket.AF_UNIX, socket.SOCK_STREAM, 0)
    fails(errno.EPROTONOSUPPORT, lib.rsocket, socket.AF_INET, socket.SOCK_DGRAM, 0)
    # a connect to a device where nobody listens on the port: refused
    r = check(lib.rsocket(socket.AF_INET, socket.SOCK_STREAM, 0), "rsocket")
    sa = sockaddr(a, port + 1)
    fails(errno.ECONNREFUSED, lib.rconnect, r, sa, len(sa))
    fails(errno.ENOTCONN, lib.rrecv, r, ctypes.create_string_buffer(4), 4, 0)
    check(lib.rclose(r), "rclose")

    # ---------------------------------------------------------------- listen, connect
    lfd = check(lib.rsocket(socket.AF_INET, socket.SOCK_STREAM, 0), "rsocket")
    one = ctypes.c_int(1)
    check(lib.rsetsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, ctypes.byref(one), 4), "rsetsockopt")
    sa = sockaddr(a, port)
    check(lib.rbind(lfd, sa, len(sa)), "rbind")
    check(lib.rlisten(lfd, 4), "rlisten")
    check(lib.rfcntl(lfd, F_SETFL, ctypes.c_long(O_NONBLOCK)), "rfcntl")
    assert lib.rfcntl(lfd, F_GETFL) & O_NONBLOCK
    fails(errno.EAGAIN, lib.raccept, lfd, None, None)        # nobody yet

    cfd = check(lib.rsocket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK, 0),
                "rsocket")
    src = sockaddr(b, 0)
    check(lib.rbind(cfd, src, len(src)), "rbind")
    fails(errno.EINPROGRESS, lib.rconnect, cfd, sa, len(sa))
    # the listener becomes readable with the connect request
    n, rev = rpoll([(lfd, POLLIN)], 10000)
    assert n == 1 and rev[0] & POLLIN, rev
    peer = ctypes.create_string_buffer(16)
    plen = ctypes.c_uint32(16)
    sfd = check(lib.raccept(lfd, peer, ctypes.byref(plen)), "raccept")
    assert socket.inet_ntoa(peer.raw[4:8]) == b, peer.raw
    # the client's connect completes: writable, SO_ERROR 0
    n, rev = rpoll([(cfd, POLLOUT)], 10000)
    assert n == 1 and rev[0] & POLLOUT and not rev[0] & POLLERR, rev
    err, elen = ctypes.c_int(-1), ctypes.c_uint32(4)
    check(lib.rgetsockopt(cfd, SOL_SOCKET, SO_ERROR, ctypes.byref(err), ctypes.byref(elen)),
          "rgetsockopt")
    assert err.value == 0
    name = ctypes.create_string_buffer(16)
    nlen = ctypes.c_uint32(16)
    check(lib.rgetpeername(cfd, name, ctypes.byref(nlen)), "rgetpeername")
    assert socket.inet_ntoa(name.raw[4:8]) == a and struct.unpack(">H", name.raw[2:4])[0] == port
    check(lib.rgetsockname(cfd, name, ctypes.byref(nlen)), "rgetsockname")
    assert socket.inet_ntoa(name.raw[4:8]) == b

    fails(errno.EFAULT, lib.rsend, cfd, None, 5, 0)
    fails(errno.EFAULT, lib.rrecv, sfd, None, 5, 0)
    fails(errno.EFAULT, lib.rpoll, None, 1, 0)

    # ---------------------------------------------------------------- rpoll with a pipe
    rp, wp = os.pipe()
    n, rev = rpoll([(sfd, POLLIN), (rp, POLLIN), (cfd, POLLOUT)], 0)
    assert n == 1 and rev == [0, 0, POLLOUT], rev             # nothing to read anywhere
    os.write(wp, b"p")
    n, rev = rpoll([(sfd, POLLIN), (rp, POLLIN)], 5000)
    assert n == 1 and rev == [0, POLLIN], rev                 # the pipe only
    os.read(rp, 1)
    t0 = time.monotonic()
    n, rev = rpoll([(sfd, POLLIN), (rp, POLLIN)], 300)
    assert n == 0 and rev == [0, 0] and time.monotonic() - t0 >= 0.25, rev   # a timeout
    fails(errno.EAGAIN, lib.rrecv, sfd, ctypes.create_string_buffer(4), 4, MSG_DONTWAIT)
    assert send(cfd, b"hello, rsocket") == 14
    n, rev = rpoll([(sfd, POLLIN), (rp, POLLIN)], 10000)
    assert n == 1 and rev == [POLLIN, 0], rev                 # the rsocket only
    # rselect over the same: the rsocket readable, the pipe not
    rset = (ctypes.c_ulong * 16)()
    for fd in (sfd, rp):
        rset[fd // 64] |= 1 << (fd % 64)
    tv = struct.pack("ll", 5, 0)
    n = check(lib.rselect(max(sfd, rp) + 1, rset, None, None, tv), "rselect")
    assert n == 1 and rset[sfd // 64] >> (sfd % 64) & 1 and not rset[rp // 64] >> (rp % 64) & 1

    # ---------------------------------------------------------------- data
    assert recv(sfd, 5, MSG_PEEK) == b"hello"                 # peek leaves it
    assert recv(sfd, 100) == b"hello, rsocket"
    big = os.urandom(3 * 1024 * 1024 + 17)                   # more than the ring holds
    sent = 0
    got = bytearray()
    while sent < len(big) or len(got) < len(big):             # one thread: both ends, no block
        if sent < len(big):
            r = lib.rsend(cfd, big[sent:], len(big) - sent, MSG_DONTWAIT)
            if r > 0:
                sent += r
            else:
                assert ctypes.get_errno() == errno.EAGAIN
        buf = ctypes.create_string_buffer(1 << 20)
        r = lib.rrecv(sfd, buf, 1 << 20, MSG_DONTWAIT)
        if r > 0:
            got += buf.raw[:r]
        else:
            assert ctypes.get_errno() == errno.EAGAIN
            rpoll([(sfd, POLLIN), (cfd, POLLOUT)], 100)
    assert bytes(got) == big
    # the other way, MSG_WAITALL across messages, on a blocking rsocket (on a
    # non-blocking one MSG_WAITALL returns what has arrived, as Linux's TCP does)
    check(lib.rfcntl(cfd, F_SETFL, ctypes.c_long(0)), "rfcntl")
    assert not lib.rfcntl(cfd, F_GETFL) & O_NONBLOCK
    for chunk in (b"a" * 1000, b"b" * 3000):
        send(sfd, chunk)
    assert recv(cfd, 4000, MSG_WAITALL) == b"a" * 1000 + b"b" * 3000

    # ---------------------------------------------------------------- end of stream
    send(cfd, b"last")
    check(lib.rshutdown(cfd, socket.SHUT_WR), "rshutdown")
    fails(errno.EPIPE, lib.rsend, cfd, b"x", 1, 0)
    assert recv(sfd, 100) == b"last"
    n, rev = rpoll([(sfd, POLLIN)], 5000)
    assert n == 1 and rev[0] & POLLIN, rev
    assert recv(sfd, 100) == b""                              # end of stream
    send(sfd, b"reply after the peer's shutdown")             # the other half still open
    assert recv(cfd, 100, MSG_WAITALL & 0) == b"reply after the peer's shutdown"
    check(lib.rclose(sfd), "rclose")
    deadline = time.monotonic() + 10
    while True:                                               # the peer's close: POLLHUP
        n, rev = rpoll([(cfd, POLLIN)], 1000)
        if rev[0] & POLLHUP or time.monotonic() > deadline:
            break
    assert rev[0] & POLLHUP and rev[0] & POLLIN, rev
    assert recv(cfd, 10) == b""
    check(lib.rclose(cfd), "rclose")
    check(lib.rclose(lfd), "rclose")
    fails(errno.EBADF, lib.rclose, lfd)
    print("ok")


if __name__ == "__main__":
    import faulthandler
    faulthandler.dump_traceback_later(120, exit=True)     # a hang says where, then ends
    main(sys.argv[1], sys.argv[2])
