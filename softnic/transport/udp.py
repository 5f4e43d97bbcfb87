"""Real UDP sockets: the only place that sends and receives datagrams.

One non-blocking socket per device, bound to the device's (IP, port): an
AF_INET socket for an IPv4 address, AF_INET6 (IPv6 only) for an IPv6 one, whose
peers' addresses are handed up as (IPv6, port) like IPv4's.
``recv_batch`` drains what the kernel holds without blocking; ``wait``
blocks until the socket is readable or a timeout passes.

Where Linux offers them, the socket uses UDP segmentation offload both ways:
``send_batch`` hands the kernel runs of equal-size datagrams to one
destination in one ``sendmsg`` (``UDP_SEGMENT``; the kernel cuts them apart,
so the wire carries the same datagrams as one ``sendto`` each), and with
``UDP_GRO`` the kernel hands up runs of datagrams from one source as one
buffer with the segment size in a control message, which ``recv_batch``
cuts apart again.  Both save a trip through the socket layer per packet.
A requester's run whose payload stays in registered memory
(``core.requester.Gather``) goes down gathered, each packet's header, payload
and ICRC, through the compiled kernel's ``sn_send_gather`` (``use_gather``).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct

from ..core.requester import Gather, Run

Address = tuple[str, int]
MAX_DATAGRAM = 65535
IP_RECVTOS = getattr(socket, "IP_RECVTOS", 13)
IPV6_RECVTCLASS = getattr(socket, "IPV6_RECVTCLASS", 66)
IPV6_TCLASS = getattr(socket, "IPV6_TCLASS", 67)
ECT0 = 0x02                 # ECN-capable transport, codepoint 10
SOL_UDP = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT = getattr(socket, "UDP_SEGMENT", 103)    # linux/udp.h: GSO segment size
UDP_GRO = getattr(socket, "UDP_GRO", 104)            # linux/udp.h: receive coalesced runs
GSO_MAX_SEGMENTS = 64                                # UDP_MAX_SEGMENTS in the kernel
GSO_MAX_BYTES = 65507                                # one IPv4 UDP payload at most
_U16 = struct.Struct("=H")
_U32 = struct.Struct("!I")
_MSG_TRUNC = int(socket.MSG_TRUNC)           # a plain int: IntFlag operations are slow
_I32 = struct.Struct("=i")


class UdpSocket:
    def __init__(self, ip: str, port: int, *, rcvbuf: int = 8 << 20, sndbuf: int = 8 << 20,
                 offload: bool = True):
        v6 = ":" in ip
        s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
        try:
            if v6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            s.bind((ip, port))
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self.sock = s
        #: IPv6: a received datagram's source is (IPv6, port, flow info, scope id),
        #: which this socket hands up as (IPv6, port)
        self.v6 = v6
        self.address: Address = s.getsockname()[:2]
        self.send_errors = 0
        self.recv_truncated = 0
        self.gso = offload
        self.gro = False
        self._tos = False
        if offload:
            try:
                s.setsockopt(SOL_UDP, UDP_GRO, 1)
                self.gro = True
            except OSError:
                pass
        self._space = socket.CMSG_SPACE(4) * 2
        # one receive buffer, reused: a receive into fresh memory (what recvmsg
        # allocates) page-faults its way through the copy out of the kernel, a
        # fifth of a bulk receiver's time
        self._rxbuf = bytearray(MAX_DATAGRAM + 1)
        self._rxview = memoryview(self._rxbuf)
        self._rxbufs = [self._rxview]
        self._gso_cmsg = {}
        self._gather = None                 # the kernel, once use_gather() says yes
        self._rx_one = None                 # its sn_rx_one, once use_kernel_rx() says yes
        self.gather_pkts = 0                # datagrams sent gathered (sn_send_gather)
        self._gather_out = None
        p = select.poll()
        p.register(s.fileno(), select.POLLIN)
        #: ``readable(0)``: does a datagram wait?  (A poll(2) costs a quarter of
        #: a non-blocking receive that finds nothing and raises.)
        self.readable = p.poll

    @property
    def rx_buffer(self) -> bytearray:
        """The one receive buffer every receive of this socket fills (``_recvmsgs``);
        a driver receiving in C (``sn_rx_stream``) hands it this buffer, whose
        received bytes it then reads through ``rx_view``."""
        return self._rxbuf

    @property
    def rx_view(self) -> memoryview:
        """``rx_buffer`` as a memoryview; a slice of it holds what was received
        until the next receive overwrites it."""
        return self._rxview

    def enable_ecn(self, *, send_ect: bool) -> None:
        """Read each datagram's ECN codepoint (``recv_batch_ecn``); with
        ``send_ect``, mark what this socket sends ECN-capable (ECT(0)), so an
        ECN-marking router sets CE instead of dropping."""
        s = self.sock
        try:
            if self.v6:
                s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
            else:
                s.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
            self._tos = True
            if send_ect:
                if self.v6:
                    s.setsockopt(socket.IPPROTO_IPV6, IPV6_TCLASS, ECT0)
                else:
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

    def send_batch(self, datagrams: list) -> None:
        """Send ``(data, addr)`` pairs in order; with GSO, each run of equal-size
        datagrams to one address (the last of a run may be shorter) goes down in
        one ``sendmsg``."""
        if not self.gso:
            for data, addr in datagrams:
                self.send(data, addr)
            return
        n = len(datagrams)
        i = 0
        while i < n:
            data, addr = datagrams[i]
            seg = len(data)
            j = i + 1
            total = seg
            limit = min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // seg) if seg else 1
            while j < n and j - i < limit:
                d2, a2 = datagrams[j]
                l2 = len(d2)
                if a2 != addr or l2 > seg:
                    break
                j += 1
                total += l2
                if l2 < seg:                 # a shorter one ends the run
                    break
            if j - i == 1:
                self.send(data, addr)
            elif j - i == 2 and len(datagrams[i + 1][0]) < seg:
                # two different datagrams (a request and an ACK, say): GSO would
                # hand them to the receiver as one, to be handled together, which
                # made a ping-pong slower, not faster (docs/performance.md, "A
                # request and the ACK behind it in one sendmsg")
                self.send(data, addr)
                self.send(datagrams[i + 1][0], addr)
            else:
                self._send_gso([d for d, _ in datagrams[i:j]], seg, addr, j - i)
            i = j

    def send_runs(self, items: list) -> None:
        """Send what ``Device.datagram_runs`` gives, in order: ``(data, addr)``
        datagrams (batched as ``send_batch`` does) and ``Run`` records, runs of
        datagrams laid end to end, which go down as slices of the buffer, as
        many segments per ``sendmsg`` as GSO takes.  A datagram just
        before a run, to its address and of its segment size (a SEND's FIRST,
        whose MIDDLEs follow as a run), goes down in the run's first
        ``sendmsg``: the same datagrams in the same order, one call fewer."""
        pending = []
        for item in items:
            if type(item) is not Run:
                pending.append(item)
                continue
            buf, addr, seg, _ = item
            first = None
            if pending:
                if self.gso and len(pending[-1][0]) == seg and pending[-1][1] == addr:
                    first = pending.pop()[0]
                if pending:
                    self.send_batch(pending)
                    pending = []
            if type(buf) is Gather:
                if self.gso and self._gather is not None:
                    self._send_gather(buf, addr, seg, first)
                    continue
                buf = buf.flatten()
            total = len(buf)
            mv = memoryview(buf)
            o = 0
            if first is not None:       # (self.gso) the first sendmsg: it and the run's head
                e = min(total, (min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // seg) - 1) * seg)
                self._send_gso([first, mv[:e]], seg, addr, 1 + -(-e // seg))
                o = e
            if not self.gso or total - o <= seg:
                for o in range(o, total, seg):
                    self.send(mv[o:o + seg], addr)
                continue
            step = min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // seg) * seg
            for o in range(o, total, step):
                e = min(o + step, total)
                if e - o <= seg:
                    self.send(mv[o:e], addr)
                else:
                    self._send_gso([mv[o:e]], seg, addr, -(-(e - o) // seg))
        if pending:
            self.send_batch(pending)

    def use_kernel_rx(self, kernel) -> bool:
        """Take each of ``recv_runs``' receives with ``kernel``'s ``sn_rx_one`` (the
        same recvmsg(2) and UDP_GRO segment size, in C: no poll(2) before it, no
        exception when nothing waits); True if this socket can (GRO on, IPv4)."""
        if kernel is None or not self.gro or self.sock.family != socket.AF_INET:
            return False
        ffi = kernel.ffi
        self._rx_one = (kernel.lib.sn_rx_one,
                        ffi.from_buffer(self._rxbuf, require_writable=True), len(self._rxbuf),
                        ffi.new("uint32_t[10]"))
        return True

    def use_gather(self, kernel) -> bool:
        """Send ``requester.Gather`` runs with ``kernel``'s ``sn_send_gather`` (the
        payload gathered from registered memory, no copy of it here); True if this
        socket can (GSO on, IPv4)."""
        if kernel is None or not self.gso or self.sock.family != socket.AF_INET:
            return False
        self._gather = kernel
        self._gather_out = kernel.ffi.new("uint32_t *"), kernel.ffi.new("int *")
        return True

    def _send_gather(self, g: Gather, addr: Address, seg: int, first=None) -> None:
        """One ``Gather`` run to ``addr``, after ``first`` (a datagram of ``seg``
        bytes) if given: ``sn_send_gather`` (GSO, as many segments per ``sendmsg``
        as ``_send_gso`` sends); without GSO after all, the rest one by one."""
        k = self._gather
        ffi = k.ffi
        ip = ip_u32(addr[0])
        lost, err = self._gather_out
        last = g.last
        done = k.lib.sn_send_gather(
            self.sock.fileno(), ip, addr[1],
            ffi.from_buffer(first) if first is not None else ffi.NULL,
            len(first) if first is not None else 0,
            ffi.from_buffer(g.heads), ffi.from_buffer(g.src),
            g.mtu, g.count, ffi.from_buffer(last) if last is not None else ffi.NULL,
            len(last) if last is not None else 0,
            min(GSO_MAX_SEGMENTS, GSO_MAX_BYTES // seg), lost, err)
        self.send_errors += lost[0]
        self.gather_pkts += done - lost[0]
        e = err[0]
        if not e:
            return
        if e in (errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EIO):
            self.gso = False                     # no segmentation offload here: one by one
            if first is not None:
                if not done:
                    self.send(first, addr)
                    done = 1
                done -= 1                        # of the run's own datagrams
            mv = memoryview(g.flatten())
            for o in range(done * seg, len(mv), seg):
                self.send(mv[o:o + seg], addr)
            return
        raise OSError(e, os.strerror(e))

    def _send_gso(self, parts: list, seg: int, addr: Address, count: int) -> None:
        cmsg = self._gso_cmsg.get(seg)
        if cmsg is None:
            cmsg = self._gso_cmsg[seg] = [(SOL_UDP, UDP_SEGMENT, _U16.pack(seg))]
        try:
            self.sock.sendmsg(parts, cmsg, 0, addr)
        except (BlockingIOError, InterruptedError):
            self.send_errors += count
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP, errno.EIO):
                self.gso = False                 # no segmentation offload here: one by one
                for d in parts:
                    if len(d) > seg:             # a run laid end to end
                        mv = memoryview(d)
                        for o in range(0, len(mv), seg):
                            self.send(mv[o:o + seg], addr)
                    else:
                        self.send(d, addr)
            elif e.errno in (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH,
                             errno.EMSGSIZE, errno.EPERM):
                self.send_errors += count
            else:
                raise

    def recv_batch(self, limit: int = 256) -> list[tuple[bytes, Address]]:
        if self.gro:
            return self._recv_batch_gro(limit)
        out = []
        recv = self.sock.recvfrom
        v6 = self.v6
        for _ in range(limit):
            try:
                data, addr = recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:   # an ICMP error for an earlier send
                continue
            out.append((data, addr[:2] if v6 else addr))
        return out

    def _recv_batch_gro(self, limit: int) -> list[tuple[bytes, Address]]:
        """``recv_batch`` with UDP_GRO on (and no ECN asked for): a coalesced run
        arrives as one buffer with its segment size, and is cut apart here."""
        out = []
        append = out.append
        for data, addr, seg in self.recv_runs(limit):
            n = len(data)
            if seg and n > seg:
                for k in range(0, n, seg):
                    append((bytes(data[k:k + seg]), addr))
            else:
                append((bytes(data), addr))
        return out

    def _recvmsgs(self, limit: int, ready: bool = False):
        """Up to ``limit`` waiting datagrams (or coalesced runs) as ``(data,
        ancillary, addr)``, one at a time: ``data`` is a view of this socket's one
        receive buffer, which the next receive overwrites, so the caller is done
        with each (or has copied it) before it asks for the next.  A truncated
        one is counted and left out.  ``ready``: the caller has just seen the
        socket readable (no second poll(2) for it)."""
        recv = self.sock.recvmsg_into
        bufs = self._rxbufs
        view = self._rxview
        space = self._space
        readable = self.readable
        v6 = self.v6
        for _ in range(limit):
            if ready:
                ready = False
            elif not readable(0):
                break
            try:
                n, anc, flags, addr = recv(bufs, space)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionRefusedError:   # an ICMP error for an earlier send
                continue
            if flags & _MSG_TRUNC or n > MAX_DATAGRAM:
                self.recv_truncated += 1     # cannot happen below 64 KiB; counted if it does
                continue
            yield view[:n], anc, (addr[:2] if v6 else addr)

    def recv_runs(self, limit: int = 256, ready: bool = False):
        """What waits, one at a time, as ``(data, addr, seg)``: with UDP_GRO, a
        coalesced run of datagrams of ``seg`` bytes laid end to end in ``data``
        (the last may be shorter), as the kernel hands it over
        (``Device.receive_run`` takes it so); ``seg`` is 0 for a lone datagram.
        ``data`` is a view of the receive buffer, valid until the caller asks
        for the next (``_recvmsgs``).  At most ``limit`` receives; ``ready`` as
        for ``_recvmsgs`` (given the kernel's receive, ``use_kernel_rx``, which
        asks nothing before it receives, it has no use)."""
        if not self.gro:
            for data, addr in self.recv_batch(limit):
                yield data, addr, 0
            return
        if self._rx_one is not None:
            yield from self._recv_runs_compiled(limit)
            return
        gro = (SOL_UDP, UDP_GRO)
        for data, anc, addr in self._recvmsgs(limit, ready):
            seg = 0
            for level, typ, cdata in anc:
                if (level, typ) == gro and len(cdata) >= 4:
                    seg = _I32.unpack_from(cdata)[0]
            yield data, addr, (seg if seg and len(data) > seg else 0)

    def _recv_runs_compiled(self, limit: int):
        """``recv_runs`` by ``sn_rx_one`` (``use_kernel_rx``), receive by receive."""
        one, buf, cap, out = self._rx_one
        fd = self.sock.fileno()         # (asked each time: a closed socket's number is reused)
        view = self._rxview
        for _ in range(limit):
            state = one(fd, buf, cap, out)
            if state == 1:
                yield view[:out[2]], (ip_str(out[5]), out[6]), out[3]
            elif state == 0:
                return
            elif state == 3:
                self.recv_truncated += 1     # cannot happen below 64 KiB; counted if it does
            else:
                raise OSError(out[9], os.strerror(out[9]))

    def recv_batch_ecn(self, limit: int = 256) -> list[tuple[bytes, Address, int]]:
        """Like ``recv_batch``, with each datagram's IP ECN codepoint (0-3)."""
        out = []
        tos = (socket.IPPROTO_IPV6, IPV6_TCLASS) if self.v6 else (socket.IPPROTO_IP,
                                                                  socket.IP_TOS)
        for data, anc, addr in self._recvmsgs(limit):
            ecn = 0
            seg = 0
            for level, typ, cdata in anc:
                if (level, typ) == tos and cdata:
                    # IP_TOS: one byte; IPV6_TCLASS: an int, the class in its low byte
                    ecn = (cdata[0] if len(cdata) == 1 else _I32.unpack_from(cdata)[0]) & 3
                elif level == SOL_UDP and typ == UDP_GRO and len(cdata) >= 4:
                    seg = _I32.unpack_from(cdata)[0]
            if seg and len(data) > seg:          # a coalesced run: cut it apart
                for k in range(0, len(data), seg):
                    out.append((bytes(data[k:k + seg]), addr, ecn))
            else:
                out.append((bytes(data), addr, ecn))
        return out

    def wait(self, timeout: float | None) -> bool:
        """Block until readable or ``timeout`` seconds pass; True if readable."""
        r, _, _ = select.select([self.sock], [], [], timeout)
        return bool(r)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def ip_u32(ip: str, _cache: dict = {}) -> int:
    """An IPv4 address as the kernel's C functions take it (host order)."""
    v = _cache.get(ip)
    if v is None:
        v = _cache[ip] = _U32.unpack(socket.inet_aton(ip))[0]
    return v


def ip_str(v: int, _cache: dict = {}) -> str:
    """The address ``ip_u32`` gives ``v`` for, as a source's text."""
    s = _cache.get(v)
    if s is None:
        s = _cache[v] = socket.inet_ntoa(_U32.pack(v))
    return s


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
