"""The requester's bulk path and the cached ICRC states.

``requester._bulk`` builds a run of MIDDLE packets (and a LAST) into one
buffer with their ICRCs; a resend takes ``requester._build`` and
``append_icrc`` packet by packet, so the two must give the same bytes.
``icrc_start`` caches the CRC over the pseudo header and the BTH's first 8
bytes; it must agree with a CRC computed over the whole pseudo packet here.
``UdpSocket.send_runs`` must put the same datagrams on the wire as one
``sendto`` each.
"""

from __future__ import annotations

import random
import socket
import struct
import time
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from enginekit import pair, pattern
from softnic.core import requester
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import SendFlags, WROpcode as W
from softnic.core.qp import RecvWR, SendWR
from softnic.transport.udp import UdpSocket
from softnic.wire.icrc import append_icrc, check_icrc, icrc, icrc_start
from softnic.wire.roce import ICRC_LEN, decode

MTUS = [256, 512, 1024, 2048, 4096]
OPS = [W.RDMA_WRITE, W.SEND, W.RDMA_WRITE_WITH_IMM, W.SEND_WITH_IMM, W.SEND_WITH_INV]
IPV4 = st.ip_addresses(v=4).map(str)
PORT = st.integers(0, 0xFFFF)


def reference_icrc(pkt: bytes, src: str, dst: str, sport: int, dport: int) -> int:
    """IBA A17 spelled out: LRH ones, IPv4 and UDP with the variant fields set to
    ones, the BTH with byte 4 set to ones, the rest; zlib's CRC-32."""
    n = len(pkt) + ICRC_LEN
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0xFF, 28 + n, 0, 0x4000, 0xFF, 17, 0xFFFF,
                     socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack("!HHHH", sport, dport, 8 + n, 0xFFFF)
    return zlib.crc32(b"\xff" * 8 + ip + udp + pkt[:4] + b"\xff" + pkt[5:])


@settings(max_examples=200)
@given(st.binary(min_size=12, max_size=4200), IPV4, IPV4, PORT, PORT)
def test_icrc_start_agrees_with_the_spelled_out_crc(pkt, src, dst, sport, dport):
    want = reference_icrc(pkt, src, dst, sport, dport)
    assert icrc(pkt, src, dst, sport, dport) == want
    start = icrc_start(src, dst, sport, dport, len(pkt) + ICRC_LEN, pkt[:8])
    assert zlib.crc32(pkt[8:], start) == want          # isal and zlib compute one CRC
    datagram = append_icrc(bytearray(pkt), src, dst, sport, dport)
    assert check_icrc(datagram, src, dst, sport, dport)
    datagram[-1] ^= 0x01
    assert not check_icrc(datagram, src, dst, sport, dport)


def test_icrc_start_masks_byte_4():
    head = bytes.fromhex("07000000ff00002a")
    other = head[:4] + b"\x3c" + head[5:]
    args = ("10.0.0.1", "10.0.0.2", 1000, 4791, 4112)
    assert icrc_start(*args, head) == icrc_start(*args, other)
    assert icrc_start(*args, head) != icrc_start(*args, head[:7] + b"\x2b")


@st.composite
def bulk_cases(draw):
    mtu = draw(st.sampled_from(MTUS))
    op = draw(st.sampled_from(OPS))
    npkts = draw(st.integers(2, 7))
    length = draw(st.integers((npkts - 1) * mtu + 1, npkts * mtu))
    # an SGE list: the message cut at random points, the pieces apart in the buffer
    ncuts = draw(st.integers(0, 3))
    cuts = sorted(draw(st.lists(st.integers(1, length - 1), min_size=ncuts, max_size=ncuts,
                                unique=True)))
    gaps = draw(st.lists(st.integers(0, 9), min_size=ncuts + 1, max_size=ncuts + 1))
    return {"mtu": mtu, "op": op, "length": length, "cuts": cuts, "gaps": gaps,
            "psn": draw(st.sampled_from([0, 0x123456, 0xFFFFFD])),
            "solicited": draw(st.booleans()),
            "since": draw(st.integers(0, 40)), "ack_every": draw(st.integers(1, 40)),
            "seed": draw(st.integers(0, 2**32 - 1))}


def _wqe(c: dict):
    p = pair(mtu=c["mtu"], psn_a=c["psn"], trace=False,
             endpoint_args={"buf_size": 1 << 16, "max_sge": 4})
    dev, qp = p.a, p.ea.qp
    rng = random.Random(c["seed"])
    data = rng.randbytes(c["length"])
    sges, pos, off = [], 0, 0
    for end, gap in zip(c["cuts"] + [c["length"]], c["gaps"]):
        off += gap
        p.ea.buf.view[off:off + end - pos] = data[pos:end]
        sges.append(p.ea.sge(off, end - pos))
        off += end - pos
        pos = end
    flags = SendFlags.SIGNALED | (SendFlags.SOLICITED if c["solicited"] else 0)
    kw = {}
    if c["op"] in (W.RDMA_WRITE, W.RDMA_WRITE_WITH_IMM):
        kw = {"remote_addr": p.eb.buf.addr, "rkey": p.eb.mr.rkey}
    if c["op"] in (W.RDMA_WRITE_WITH_IMM, W.SEND_WITH_IMM):
        kw["imm_data"] = 0x01020304
    if c["op"] == W.SEND_WITH_INV:
        kw["invalidate_rkey"] = 0x55667788
    dev.post_send(qp, SendWR(1, c["op"], sges, flags, **kw))
    wqe = qp.sq[-1]
    requester.start(dev, qp, wqe)
    return dev, qp, wqe, data


@settings(max_examples=60, deadline=None)
@given(bulk_cases(), st.data())
def test_bulk_run_is_byte_for_byte_what_build_gives(c, data):
    dev, qp, wqe, payload = _wqe(c)
    end = requester._run_end(qp, wqe)
    lo = 0 if c["op"] in requester._RUN_FIRST else 1      # a SEND's run may start at its FIRST
    idx = data.draw(st.integers(lo, end - 1) if end > lo else st.just(lo), label="idx")
    if idx >= end:
        return                    # a two-packet WRITE whose LAST carries a header
    k = data.draw(st.integers(1, end - idx), label="k")
    dest = qp.dest
    qp.req.pkts_since_ackreq = c["since"]
    buf, seg = requester._bulk(dev, qp, wqe, idx, k, dest, c["ack_every"])
    got = [bytes(buf[o:o + seg]) for o in range(0, len(buf), seg)]
    assert len(got) == k
    s = c["since"]
    for i, datagram in enumerate(got):
        s += 1
        ackreq = s >= c["ack_every"]
        if ackreq or idx + i == wqe.npkts - 1:      # a LAST always asks for an ACK
            s = 0
        want = append_icrc(requester._build(dev, qp, wqe, idx + i, ackreq),
                           dev.ip, dest[0], dev.port, dest[1])
        assert datagram == bytes(want), f"packet {idx + i} of {wqe.npkts}"
        pkt = decode(datagram[:-4])
        off = (idx + i) * c["mtu"]
        assert bytes(pkt.payload) == payload[off:off + c["mtu"]]
    assert qp.req.pkts_since_ackreq == s


def _transfer(selective_repeat: bool, drop_every: int | None, op=W.RDMA_WRITE):
    """A long WRITE (or SEND) of several SGEs through the fabric, optionally with
    every ``drop_every``-th request packet lost once; returns what was sent."""
    sent: dict[int, list[bytes]] = {}
    n = [0]

    def drop(pkt, raw):
        if not pkt.info.is_request:
            return False
        sent.setdefault(pkt.bth.psn, []).append(bytes(raw))
        n[0] += 1
        return drop_every is not None and len(sent[pkt.bth.psn]) == 1 and \
            n[0] % drop_every == 0

    cfg = DeviceConfig(min_timer=1e-3, selective_repeat=selective_repeat, window=8)
    p = pair(mtu=1024, config=cfg, drop_a=drop, endpoint_args={"buf_size": 1 << 16})
    msg = pattern(20000, salt=3)
    p.ea.buf.view[0:7000] = msg[:7000]
    p.ea.buf.view[8000:21000] = msg[7000:]
    sges = [p.ea.sge(0, 7000), p.ea.sge(8000, 13000)]
    if op == W.SEND:
        p.b.post_recv(p.eb.qp, RecvWR(7, [p.eb.sge(30000, 20000)]))
        wr = SendWR(1, W.SEND, sges, SendFlags.SIGNALED)
    else:
        wr = SendWR(1, W.RDMA_WRITE, sges, SendFlags.SIGNALED,
                    remote_addr=p.eb.buf.addr + 30000, rkey=p.eb.mr.rkey)
    p.a.post_send(p.ea.qp, wr)
    p.fabric.flush()
    p.run_until(lambda: len(p.send_wcs()) == 1)
    assert p.send_wcs()[0].status == 0
    assert bytes(p.eb.buf.view[30000:50000]) == msg
    return sent


def test_resends_repeat_the_bulk_packets_bytes():
    """Packets lost from a run are rebuilt by ``_build`` on resend: with go-back-N
    and selective repeat, every resend has the bytes of the first transmission,
    except the AckReq bit (a resend may ask for an ACK) and so the ICRC."""
    for sr in (False, True):
        for op in (W.RDMA_WRITE, W.SEND):
            sent = _transfer(sr, 5, op)
            resent = [v for v in sent.values() if len(v) > 1]
            assert resent, "the loss pattern hit nothing"
            for copies in resent:
                first = decode(copies[0][:-4])
                for again in copies[1:]:
                    pkt = decode(again[:-4])
                    assert (pkt.bth.opcode, pkt.bth.psn, pkt.bth.se, pkt.bth.pad) == \
                        (first.bth.opcode, first.bth.psn, first.bth.se, first.bth.pad)
                    assert bytes(pkt.payload) == bytes(first.payload)
                    if pkt.bth.ackreq == first.bth.ackreq:
                        assert again == copies[0]


def test_lossless_transfer_counts_every_packet():
    sent = _transfer(False, None)
    assert len(sent) == 20 and all(len(v) == 1 for v in sent.values())


def _pair_of_sockets():
    a = UdpSocket("127.0.0.1", 0)
    b = UdpSocket("127.0.0.1", 0)
    return a, b


def _drain(sock: UdpSocket, n: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(got) < n and time.monotonic() < deadline:
        sock.wait(0.05)
        got += [bytes(d) for d, _ in sock.recv_batch()]
    return got


def test_send_runs_puts_each_datagram_on_the_wire():
    for gso in (True, False):
        a, b = _pair_of_sockets()
        try:
            a.gso = a.gso and gso
            rng = random.Random(5)
            seg = 1040
            run = [rng.randbytes(seg) for _ in range(40)] + [rng.randbytes(300)]
            single = rng.randbytes(1100)
            items = [(single, b.address),
                     requester.Run(bytearray(b"".join(run)), b.address, seg, len(run)),
                     (b"tail", b.address)]
            a.send_runs(items)
            got = _drain(b, 43)
            assert got == [single] + run + [b"tail"]
        finally:
            a.close()
            b.close()


def test_device_datagram_runs_expand_to_datagrams_to_send():
    """The two pull calls give the same datagrams: two pairs of devices, each
    posting the same WRITE (to buffers at different addresses, so the FIRSTs'
    RETHs differ)."""
    outs = []
    for runs in (True, False):
        p = pair(mtu=1024, trace=False, endpoint_args={"buf_size": 1 << 16})
        p.ea.buf.view[0:9000] = pattern(9000)
        p.a.post_send(p.ea.qp, SendWR(1, W.RDMA_WRITE, [p.ea.sge(0, 9000)], SendFlags.SIGNALED,
                                      remote_addr=p.eb.buf.addr, rkey=p.eb.mr.rkey))
        if runs:
            flat = []
            for item in p.a.datagram_runs(0.0):
                if type(item) is not requester.Run:
                    flat.append((bytes(item[0]), item[1]))
                else:
                    buf, dst, seg, _ = item
                    flat += [(bytes(buf[o:o + seg]), dst) for o in range(0, len(buf), seg)]
            outs.append(flat)
        else:
            outs.append(p.a.datagrams_to_send(0.0))
        assert p.a.counters["sent_pkts"] == 9
    assert [len(d) for d, _ in outs[0]] == [len(d) for d, _ in outs[1]]
    assert outs[0][1:] == outs[1][1:]
    assert outs[0][0][0][:12] == outs[1][0][0][:12]
    assert all(type(d) is bytes for d, _ in outs[1])


def _gather_run(mtu: int, length: int, kern):
    """A real WRITE's bulk run as a device that gathers leaves it: the Gather
    (MIDDLEs and the LAST), its segment size and the devices (the Gather's payload
    is their memory: the caller keeps them while it uses the Gather)."""
    p = pair(mtu=mtu, trace=False, endpoint_args={"buf_size": 1 << 17})
    p.a.kernel, p.a.tx_gather = kern, True
    p.ea.buf.view[0:length] = pattern(length)
    p.a.post_send(p.ea.qp, SendWR(1, W.RDMA_WRITE, [p.ea.sge(0, length)], SendFlags.SIGNALED,
                                  remote_addr=p.eb.buf.addr, rkey=p.eb.mr.rkey))
    runs = [item for item in p.a.datagram_runs(0.0) if type(item) is requester.Run]
    assert len(runs) == 1 and type(runs[0].buf) is requester.Gather
    return runs[0].buf, runs[0].seg, p


def test_a_gathered_run_puts_the_runs_datagrams_on_the_wire():
    """``sn_send_gather``: each packet's BTH, its payload from registered memory
    and its ICRC, one datagram each on the wire, the bytes ``flatten`` gives
    (GSO cuts a 64 KiB run into more than one sendmsg: 60 MIDDLEs of 1 KiB)."""
    from softnic import accel
    kern = accel.load()
    if kern is None:
        pytest.fail(f"no kernel: {accel.error}")
    for mtu, length in ((1024, 62 * 1024 - 100), (4096, 5 * 4096), (256, 2000)):
        g, seg, keep = _gather_run(mtu, length, kern)
        flat = bytes(g.flatten())
        want = [flat[o:o + seg] for o in range(0, len(flat), seg)]
        a, b = _pair_of_sockets()
        try:
            assert a.use_gather(kern)
            a.send_runs([(b"head", b.address), requester.Run(g, b.address, seg, len(want)),
                         (b"tail", b.address)])
            got = _drain(b, len(want) + 2)
            assert got == [b"head"] + want + [b"tail"], f"MTU {mtu}"
            assert a.send_errors == 0
        finally:
            a.close()
            b.close()


def test_a_part_of_a_gathered_run_is_that_part_of_its_bytes():
    """``Gather.part(i, j)``, what a fault model that drops leaves of a run, is
    packets i .. j-1 of the flattened run (the LAST among them or not)."""
    from softnic import accel
    kern = accel.load()
    if kern is None:
        pytest.fail(f"no kernel: {accel.error}")
    g, seg, keep = _gather_run(1024, 9 * 1024 + 77, kern)
    flat = bytes(g.flatten())
    n = g.count + 1
    assert g.last is not None and len(flat) == g.count * seg + len(g.last)
    for i in range(n):
        for j in range(i + 1, n + 1):
            part = g.part(i, j)
            assert bytes(part.flatten()) == flat[i * seg:j * seg], (i, j)
            assert len(part) == len(flat[i * seg:j * seg])


class _RefusingKernel:
    """A kernel whose gathered send finds no GSO (EINVAL) after ``ok`` datagrams."""

    def __init__(self, k, ok: int):
        import types
        import errno

        def send(fd, ip, port, first, first_len, heads, src, mtu, count, last, last_len,
                 per_call, lost, err):
            lost[0] = 0
            err[0] = errno.EINVAL
            return ok
        self.ffi = k.ffi
        self.lib = types.SimpleNamespace(sn_send_gather=send)


def test_a_gathered_run_falls_back_to_one_datagram_each_where_gso_is_refused():
    from softnic import accel
    kern = accel.load()
    if kern is None:
        pytest.fail(f"no kernel: {accel.error}")
    g, seg, keep = _gather_run(1024, 9 * 1024, kern)
    flat = bytes(g.flatten())
    want = [flat[o:o + seg] for o in range(0, len(flat), seg)]
    a, b = _pair_of_sockets()
    try:
        assert a.use_gather(_RefusingKernel(kern, 3))
        a.send_runs([requester.Run(g, b.address, seg, len(want))])
        assert not a.gso
        assert _drain(b, len(want) - 3) == want[3:]      # the 3 it sent are not sent again
        assert a.send_errors == 0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("ok", [0, 1, 3])
def test_a_gathered_run_after_its_first_falls_back_without_sending_twice(ok):
    """GSO refused after ``ok`` datagrams of a FIRST and its gathered run: the rest
    go one by one, none of those sent again, the FIRST once."""
    from softnic import accel
    kern = accel.load()
    if kern is None:
        pytest.fail(f"no kernel: {accel.error}")
    g, seg, keep = _gather_run(1024, 9 * 1024, kern)
    flat = bytes(g.flatten())
    first = bytes(random.Random(ok).randbytes(seg))
    want = [first] + [flat[o:o + seg] for o in range(0, len(flat), seg)]
    a, b = _pair_of_sockets()
    try:
        assert a.use_gather(_RefusingKernel(kern, ok))
        a.send_runs([(first, b.address), requester.Run(g, b.address, seg, len(want) - 1)])
        assert not a.gso
        assert _drain(b, len(want) - ok) == want[ok:]
    finally:
        a.close()
        b.close()


class _Counting:
    """A socket that counts the calls that send."""

    def __init__(self, sock):
        self.sock = sock
        self.calls = 0

    def sendmsg(self, *args):
        self.calls += 1
        return self.sock.sendmsg(*args)

    def sendto(self, data, addr):
        self.calls += 1
        return self.sock.sendto(data, addr)

    def fileno(self):
        return self.sock.fileno()


@pytest.mark.parametrize("gather", [False, True])
def test_a_send_first_leaves_in_its_runs_sendmsg(gather):
    """A SEND's FIRST carries no extended header, so it is the size of its MIDDLEs:
    the device gives it at the head of the run of its MIDDLEs
    (``requester._RUN_FIRST``), the same datagrams on the wire in one ``sendmsg``
    (GSO): a SEND (its LAST plain, in the run) in one call, a SEND_WITH_IMM too
    when its LAST with the immediate is no longer than a MIDDLE, in two when it
    would be (a LAST of a whole MTU and the immediate: after the run,
    ``requester._run_end``).  A WRITE's FIRST (its RETH makes it longer) goes
    alone: two calls.  A SEND's FIRST given alone just
    before the rest of its run (``split``: as a window with room for the FIRST
    only leaves it) still goes in the run's first ``sendmsg`` (``send_runs``)."""
    from softnic import accel
    kern = accel.load() if gather else None
    if gather and kern is None:
        pytest.fail(f"no kernel: {accel.error}")
    for op, n, shape, calls, split in ((W.SEND, 8255, ["run"], 1, False),
                                       (W.SEND, 8255, ["one", "run"], 1, True),
                                       (W.SEND_WITH_IMM, 8255, ["run"], 1, False),
                                       (W.SEND_WITH_IMM, 8192, ["run", "one"], 2, False),
                                       (W.RDMA_WRITE, 8255, ["one", "run"], 2, False)):
        p = pair(mtu=1024, trace=False, endpoint_args={"buf_size": 1 << 16})
        if gather:
            p.a.kernel, p.a.tx_gather = kern, True
        p.ea.buf.view[0:n] = pattern(n)
        p.a.post_send(p.ea.qp, SendWR(1, op, [p.ea.sge(0, n)], SendFlags.SIGNALED,
                                      remote_addr=p.eb.buf.addr, rkey=p.eb.mr.rkey,
                                      imm_data=7))
        items = p.a.datagram_runs(0.0)
        if split:                       # the run's FIRST as a datagram of its own before it
            run, dest, seg, count = items[0]
            flat = run.flatten() if type(run) is requester.Gather else run
            rest = run.part(1, run.count + 1) if type(run) is requester.Gather \
                else memoryview(run)[seg:]
            items = [(bytes(flat[:seg]), dest), requester.Run(rest, dest, seg, count - 1)]
        assert ["run" if type(i) is requester.Run else "one" for i in items] == shape, op
        want = []
        for item in items:
            if type(item) is not requester.Run:
                want.append(bytes(item[0]))
            else:
                run, _, seg, _ = item
                flat = bytes(run.flatten() if type(run) is requester.Gather else run)
                want += [flat[o:o + seg] for o in range(0, len(flat), seg)]
        a, b = _pair_of_sockets()
        real = a.sock
        try:
            counting = _Counting(real)
            if gather:          # (sn_send_gather's run of 9 datagrams is one sendmsg)
                import types

                def counted(*args):
                    counting.calls += 1
                    return kern.lib.sn_send_gather(*args)
                assert a.use_gather(types.SimpleNamespace(
                    ffi=kern.ffi, lib=types.SimpleNamespace(sn_send_gather=counted)))
            a.sock = counting
            a.send_runs([i._replace(dest=b.address) if type(i) is requester.Run
                         else (i[0], b.address) for i in items])
            assert a.sock.calls == calls, op
            a.sock = real
            assert _drain(b, len(want)) == want, op
            assert a.send_errors == 0
        finally:
            a.sock = real
            a.close()
            b.close()


class _NoGso:
    """A socket whose kernel refuses UDP_SEGMENT (as on an interface MTU below the
    segment size): sendmsg fails with EINVAL, sendto works."""

    def __init__(self, sock):
        self.sock = sock

    def sendmsg(self, *args):
        import errno
        raise OSError(errno.EINVAL, "Invalid argument")

    def sendto(self, data, addr):
        return self.sock.sendto(data, addr)


def test_send_runs_falls_back_to_one_datagram_each_where_gso_is_refused():
    a, b = _pair_of_sockets()
    real = a.sock
    try:
        a.gso = True
        a.sock = _NoGso(real)
        rng = random.Random(6)
        seg = 700
        run = [rng.randbytes(seg) for _ in range(5)] + [rng.randbytes(12)]
        a.send_runs([requester.Run(bytearray(b"".join(run)), b.address, seg, len(run))])
        assert not a.gso
        assert _drain(b, 6) == run
        assert a.send_errors == 0
    finally:
        a.sock = real
        a.close()
        b.close()


def test_live_capture_and_faults_see_each_datagram_of_a_run(tmp_path):
    """With a capture and a fault model the driver hands every datagram of a run
    to both on its own: the pcap holds every packet the device counted, each
    with a good ICRC, and a lost one is resent."""
    from softnic.driver.config import DeviceSpec, RuntimeConfig
    from softnic.driver.faults import FaultModel
    from softnic.driver.nic import NIC
    from softnic.experiments.rig import bring_up, endpoint

    cfg = RuntimeConfig(capture=str(tmp_path / "run.pcap"), faults=FaultModel.parse("loss=0.05"),
                        seed=11, min_timer=2e-3)
    a, b = (NIC(DeviceSpec(f"r{i}", None, 0), cfg) for i in range(2))
    try:
        with a.lock, b.lock:
            ea, eb = endpoint(a.dev, buf_size=1 << 18), endpoint(b.dev, buf_size=1 << 18)
            bring_up(ea, eb, mtu=1024, timeout=10)
            bring_up(eb, ea, mtu=1024, timeout=10)
        data = random.Random(2).randbytes(200_000)
        ea.buf.view[:len(data)] = data
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, len(data))],
                                              SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                              rkey=eb.mr.rkey))
        got = []
        a.wait_until(lambda: got.extend(a.dev.poll_cq(ea.send_cq, 4)) or got, 30)
        assert got and got[0].status == 0
        assert bytes(eb.buf.view[:len(data)]) == data
        sent = a.counters["sent_pkts"]
        assert a.counters["fault_dropped_loss"] > 0 and a.counters["retransmitted_pkts"] > 0
    finally:
        a.close()
        b.close()
    raw = (tmp_path / "run-r0.pcap").read_bytes()
    frames, o = [], 24                              # LINKTYPE_RAW: IPv4 frames, no link header
    while o < len(raw):
        incl = struct.unpack_from("<I", raw, o + 8)[0]
        frames.append(raw[o + 16:o + 16 + incl])
        o += 16 + incl
    src, sport = socket.inet_aton(a.ip), a.port
    mine = [f for f in frames if f[12:16] == src and struct.unpack_from("!H", f, 20)[0] == sport]
    assert len(mine) == sent            # dropped ones too: the capture sits before the faults
    for f in mine:
        dport = struct.unpack_from("!H", f, 22)[0]
        assert check_icrc(f[28:], a.ip, socket.inet_ntoa(f[16:20]), sport, dport)


@given(st.binary(max_size=12), IPV4, IPV4, PORT, PORT)
def test_icrc_of_short_packets_is_the_spelled_out_crc(pkt, src, dst, sport, dport):
    assert icrc(pkt, src, dst, sport, dport) == reference_icrc(pkt, src, dst, sport, dport)


@settings(max_examples=60, deadline=None)
@given(bulk_cases(), st.booleans())
def test_a_first_packed_straight_is_what_encode_gives(c, ackreq):
    """``_build``'s FIRST (fast path) against ``encode``'s (``fast_path=False``)."""
    dev, qp, wqe, payload = _wqe(c)
    fast = requester._build(dev, qp, wqe, 0, ackreq)
    dev.fast = False
    try:
        assert bytes(fast) == bytes(requester._build(dev, qp, wqe, 0, ackreq))
    finally:
        dev.fast = True
    pkt = decode(fast)
    assert pkt.info.first and not pkt.info.last and bytes(pkt.payload) == payload[:c["mtu"]]
