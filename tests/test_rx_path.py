"""The live receive path: one reused receive buffer, and ACKs that leave while a
step is still receiving.

``UdpSocket.recv_runs`` hands out views of one buffer that the next receive
overwrites, so ``Device.receive_run`` copies whatever it passes on to
``receive_datagram`` (which may hold a packet); a step of the live NIC that
keeps receiving a stream sends its coalesced ACK after every half window of
data, so the sender's window does not run dry behind a busy socket.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from hypothesis import given, note, settings, strategies as st

from softnic.experiments.rig import bring_up, endpoint
from softnic.core.device import Device
from softnic.core.enums import SendFlags, WROpcode as W
from softnic.core.qp import SendWR
from softnic.core.requester import Run
from softnic.driver.config import DeviceSpec, RuntimeConfig
from softnic.driver.nic import NIC
from softnic.transport.udp import UdpSocket
from softnic.wire.roce import Opcode


def test_each_received_view_is_whole_until_the_next_receive():
    rx = UdpSocket("127.0.0.1", 0)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sent = [bytes([i]) * n for i, n in ((1, 1000), (2, 30), (3, 4000))]
        for d in sent:
            tx.sendto(d, rx.address)
        got = []
        for _ in range(50):
            for data, src, seg in rx.recv_runs(16, False):
                got.append(bytes(data))      # taken before asking for the next
            if len(got) == 3:
                break
            rx.wait(1.0)
        assert got == sent
    finally:
        rx.close()
        tx.close()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 1400), st.integers(0, 1399)),
                min_size=1, max_size=8))
def test_the_kernels_receive_is_the_sockets(sends):
    """``recv_runs`` by the kernel's ``sn_rx_one`` (``use_kernel_rx``, what the live
    NIC uses) and by Python's ``recvmsg_into``: the same datagrams and GRO runs
    (their bytes, source and segment size), the same end when nothing waits.
    Each send is a run of equal datagrams (GSO; one: a lone datagram) and a
    shorter tail, sent twice, once for each receive."""
    from softnic import accel
    kern = accel.load()
    if kern is None:
        pytest.fail(f"no kernel: {accel.error}")
    note(f"sends {sends}")
    got = {}
    for compiled in (False, True):
        rx, tx = UdpSocket("127.0.0.1", 0), UdpSocket("127.0.0.1", 0)
        try:
            assert rx.use_kernel_rx(kern) if compiled else rx._rx_one is None
            for i, (k, seg, tail) in enumerate(sends):
                body = bytes((i * 7 + j) & 0xFF for j in range(k * seg)) + bytes([i]) * min(tail, seg)
                if k > 1 and tx.gso:
                    tx._send_gso([body], seg, rx.address, -(-len(body) // seg))
                else:
                    for o in range(0, len(body), seg):
                        tx.send(body[o:o + seg], rx.address)
            out, deadline = [], time.monotonic() + 5
            want = sum(k + (tail > 0) for k, _, tail in sends)
            while sum(max(1, -(-len(d) // s)) if s else 1 for d, _, s in out) < want:
                assert time.monotonic() < deadline, out
                rx.wait(0.5)
                out += [(bytes(d), a, s) for d, a, s in rx.recv_runs(64)]
            assert list(rx.recv_runs(8)) == []          # nothing waits: the same end
            got[compiled] = [(d, a[0], s) for d, a, s in out]
        finally:
            rx.close()
            tx.close()
    assert got[True] == got[False]


def test_receive_run_copies_what_it_passes_on():
    """A datagram (or a run's packet) handed to receive_datagram survives the
    buffer it came in being reused."""
    dev = Device("d", "10.0.0.9")
    seen = []
    dev.receive_datagram = lambda data, src, now, *a: seen.append((data, bytes(data)))
    buf = bytearray(b"\x11" * 300)
    view = memoryview(buf)
    dev.receive_run(view[:100], 0, ("10.0.0.1", 4791), 0.0)        # a lone datagram
    dev.receive_run(view[:300], 100, ("10.0.0.1", 4791), 0.0)      # a run of three
    buf[:] = b"\x22" * 300                                          # the next receive
    assert len(seen) == 4
    for data, at_the_time in seen:
        assert bytes(data) == at_the_time == b"\x11" * 100


def test_a_streaming_step_sends_its_ack_before_the_last_run():
    b = NIC(DeviceSpec("rxp0", None, 0), RuntimeConfig(min_timer=2e-3))
    a = Device("a", "127.0.0.250", 4791)
    try:
        with b.lock:
            ea, eb = endpoint(a, buf_size=4 << 20), endpoint(b.dev, buf_size=4 << 20)
            bring_up(ea, eb, mtu=4096)
            bring_up(eb, ea, mtu=4096)
        a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 2 << 20)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
        # what a sends first (a window's worth), cut into runs of 15 as GRO hands them up
        pkts = []
        for item in a.datagram_runs(0.0):
            data, seg = item[0], (item.seg if type(item) is Run else len(item[0]))
            pkts += [bytes(data[o:o + seg]) for o in range(0, len(data), seg)]
        seg = len(pkts[1])
        runs = [b"".join(pkts[i:i + 15]) for i in range(1, len(pkts), 15)]
        assert len(pkts) == a.config.window and len(runs) >= 8
        taken = []
        sent = []                       # (runs taken when it left, datagram)

        me = threading.get_ident()

        def recv_runs(limit, ready=False):
            if threading.get_ident() != me:
                return                                # (b's progress thread, if it wakes)
            yield pkts[0], (a.ip, a.port), 0          # the FIRST, with its RETH
            for r in runs:
                taken.append(r)
                yield memoryview(bytearray(r)), (a.ip, a.port), seg

        b.sock.recv_runs = recv_runs
        b._stream = None            # (the engine's loop over recv_runs; the kernel's: below)
        b.sock.send = lambda data, addr: sent.append((len(taken), bytes(data)))
        b.sock.send_runs = lambda items: sent.extend((len(taken), bytes(i[0])) for i in items)
        with b.lock:
            b._step(0.0)
        acks = [(n, d) for n, d in sent if d[0] == Opcode.RC_ACKNOWLEDGE]
        assert acks, "no ACK at all"
        assert acks[0][0] < len(runs), "the first ACK waited for the step's last run"
        # the ACKs are coalesced: fewer than the AckReqs received
        assert len(acks) < len(pkts) // (a.config.window // 4) + 1
        assert bytes(eb.buf.view[:len(pkts) * 4096 - 4096]) == \
            bytes(ea.buf.view[:len(pkts) * 4096 - 4096])
    finally:
        b.close()


def test_a_stream_taken_by_the_kernel_sends_its_ack_before_the_last_run():
    """The same with the runs in b's socket, where the progress thread's step takes
    them run after run in the kernel (``sn_rx_stream``): the first ACK leaves
    while MIDDLEs still wait (it names a PSN below the last one), and every byte
    lands."""
    from softnic import accel
    if accel.load() is None:
        pytest.fail(f"no kernel: {accel.error}")
    tx = UdpSocket("127.0.0.250", 0)                  # sends runs with GSO, as a NIC does
    b = NIC(DeviceSpec("rxp1", None, 0), RuntimeConfig(min_timer=2e-3))
    a = Device("a", "127.0.0.250", tx.address[1])
    try:
        assert b._stream is not None
        with b.lock:
            ea, eb = endpoint(a, buf_size=4 << 20), endpoint(b.dev, buf_size=4 << 20)
            bring_up(ea, eb, mtu=4096)
            bring_up(eb, ea, mtu=4096)
        ea.buf.view[:2 << 20] = bytes(range(256)) * (2 << 12)
        a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 2 << 20)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
        items = a.datagram_runs(0.0)
        pkts = []
        for item in items:
            data, seg = item[0], (item.seg if type(item) is Run else len(item[0]))
            pkts += [bytes(data[o:o + seg]) for o in range(0, len(data), seg)]
        assert len(pkts) == a.config.window
        sent = []
        with b.lock:                    # (b's progress thread waits: this step takes them)
            b.sock.send = lambda data, addr: sent.append(bytes(data))
            b.sock.send_runs = lambda items: sent.extend(bytes(i[0]) for i in items)
            tx.send_runs([item._replace(dest=b.sock.address) if type(item) is Run
                          else (item[0], b.sock.address) for item in items])
            time.sleep(0.05)
            b._step(0.0)
        acks = [d for d in sent if d[0] == Opcode.RC_ACKNOWLEDGE]
        last = int.from_bytes(pkts[-1][9:12], "big")
        assert acks, "no ACK at all"
        assert int.from_bytes(acks[0][9:12], "big") != last, \
            "the first ACK waited for the step's last run"
        assert b.counters["rx_stream_pkts"] > len(pkts) // 2
        n = (len(pkts) - 1) * 4096
        assert bytes(eb.buf.view[:n]) == bytes(ea.buf.view[:n])
    finally:
        b.close()
        tx.close()



def _requester_and_peer(name: str, host: str):
    """A live NIC ``b`` (its kernel loaded) and, on a UDP socket ``tx`` of its own
    at ``host``, an engine device ``a`` with the kernel, to answer ``b``'s READs."""
    from softnic import accel
    if accel.load() is None:
        pytest.fail(f"no kernel: {accel.error}")
    tx = UdpSocket(host, 0)
    b = NIC(DeviceSpec(name, None, 0), RuntimeConfig(min_timer=2e-3))
    a = Device("a", host, tx.address[1])
    a.kernel = accel.load()
    return tx, b, a


@pytest.mark.parametrize("step", ["thread", "poll1", "poll2"])
def test_a_reads_responses_are_streamed_into_its_sge_by_the_kernel(step):
    """A long READ's RESPONSE MIDDLEs, sent as a NIC sends them (the responder's
    run, GSO), are taken by the requester run after run in the kernel
    (``sn_rx_reads``, ``completer.reads_target``): every byte lands in the
    READ's SGE and the READ completes in one step.  ``thread``: the progress
    thread's step; ``poll1``/``poll2``: the inline step of a program polling
    its CQ for the READ (``NIC.poll``), which takes the FIRST as it takes any
    run and then streams the MIDDLEs that wait and the LAST that ends them,
    whatever number of runs it may take (the C face's ``ibv_poll_cq`` asks for
    two)."""
    tx, b, a = _requester_and_peer("rxp2", "127.0.0.249")
    try:
        assert b._stream is not None
        n = 128 * 4096
        with b.lock:            # (b's progress thread waits: this step takes them)
            ea, eb = endpoint(a, buf_size=1 << 20), endpoint(b.dev, buf_size=1 << 20)
            bring_up(ea, eb, mtu=4096)
            bring_up(eb, ea, mtu=4096)
            ea.buf.view[:n] = bytes(range(251)) * (n // 251) + bytes(n % 251)
            b.dev.post_send(eb.qp, SendWR(1, W.RDMA_READ, [eb.sge(0, n)], SendFlags.SIGNALED,
                                          remote_addr=ea.buf.addr, rkey=ea.mr.rkey))
            for data, _ in b.dev.datagrams_to_send(0.0):    # the READ request
                a.receive_datagram(bytes(data), b.dev.address, 0.0)
            items = a.datagram_runs(0.0)
            assert any(type(i) is Run for i in items), "the responses were not built as a run"
            tx.send_runs([item._replace(dest=b.sock.address) if type(item) is Run
                          else (item[0], b.sock.address) for item in items])
            time.sleep(0.05)
            if step == "thread":
                b._step(0.0)
            else:
                b.poll(int(step[-1]))
            wcs = b.dev.poll_cq(eb.send_cq, 4)
        assert [(w.wr_id, int(w.status)) for w in wcs] == [(1, 0)]
        assert b.counters["rx_stream_pkts"] > 64
        assert bytes(eb.buf.view[:n]) == bytes(ea.buf.view[:n])
    finally:
        b.close()
        tx.close()


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1024, 4096]),
       st.lists(st.tuples(st.integers(1, 3 * 4096) | st.integers(2, 12).map(lambda k: k * 1024),
                          st.sampled_from([1, 1, 1, 2])), min_size=1, max_size=8),
       st.sampled_from(["none", "duplicate", "stranger", "ack"]), st.data())
def test_reads_responses_one_read_after_another_are_the_kernels(mtu, reads, extra, data):
    """READs one after another (of one packet or many, one SGE or two), their
    responses sent as a NIC sends them: the requester's kernel takes them READ
    after READ (``sn_rx_reads``, ``completer.reads_target``) where it may, and
    leaves the rest to the engine (a READ of one packet or two SGEs, and a
    datagram between them: a response again, one for a QP it does not have, an
    ACK); every READ completes in order with the bytes it read, and the QP is
    left as the engine leaves it (every PSN acknowledged, no READ outstanding)."""
    tx, b, a = _requester_and_peer("rxp3", "127.0.0.250")
    try:
        size = 1 << 16
        with b.lock:            # (b's progress thread waits: these steps take them)
            ea, eb = endpoint(a, buf_size=1 << 17), endpoint(b.dev, buf_size=1 << 17)
            bring_up(ea, eb, mtu=mtu)
            bring_up(eb, ea, mtu=mtu)
            ea.buf.view[:1 << 17] = bytes(range(251)) * ((1 << 17) // 251) \
                + bytes((1 << 17) % 251)
            at = []
            for i, (n, sges) in enumerate(reads):
                src = data.draw(st.integers(0, size - n), label=f"READ {i} from")
                h = n // 2 if sges == 2 and n > 1 else n
                sgl = [eb.sge(i * 16384, h)] + ([eb.sge(i * 16384 + h + 7, n - h)] if h < n
                                                 else [])
                at.append((src, sgl))
                b.dev.post_send(eb.qp, SendWR(i, W.RDMA_READ, sgl, SendFlags.SIGNALED,
                                              remote_addr=ea.buf.addr + src, rkey=ea.mr.rkey))
            for d, _ in b.dev.datagrams_to_send(0.0):       # the READ requests
                a.receive_datagram(bytes(d), b.dev.address, 0.0)
            sent = []
            for item in a.datagram_runs(0.0):
                buf = bytes(item[0])
                seg = item.seg if type(item) is Run else len(buf)
                sent += [buf[o:o + seg] for o in range(0, len(buf), seg)]
            if extra != "none":
                k = data.draw(st.integers(0, len(sent)), label="extra at")
                if extra == "duplicate":
                    d = sent[data.draw(st.integers(0, max(0, k - 1)), label="again")]
                elif extra == "stranger":
                    d = bytearray(sent[0])
                    d[5:8] = (eb.qp.qpn + 77).to_bytes(3, "big")
                    d = bytes(d)
                else:
                    d = _ack(a, ea)
                sent.insert(k, d)
            tx.send_batch([(d, b.sock.address) for d in sent])
            time.sleep(0.05)
            wcs = []
            for _ in range(20):
                b._step(0.0)
                wcs += b.dev.poll_cq(eb.send_cq, 16)
                if len(wcs) == len(reads):
                    break
        note(f"{len(sent)} datagrams, {b.counters['rx_stream_pkts']} streamed")
        assert [(w.wr_id, int(w.status)) for w in wcs] == [(i, 0) for i in range(len(reads))]
        for (src, sgl), (n, _) in zip(at, reads):
            got = b"".join(bytes(eb.buf.view[s[0] - eb.buf.addr:s[0] - eb.buf.addr + s[1]])
                           for s in sgl)
            assert got == bytes(ea.buf.view[src:src + n])
        qp = eb.qp
        assert qp.comp.acked_psn == (qp.req.psn - 1) & 0xFFFFFF
        assert qp.req.rd_atomic == 0 and not qp.sq
    finally:
        b.close()
        tx.close()


def _ack(a, ea) -> bytes:
    """An ACK from ``a``'s QP (of nothing new: the requester ignores it)."""
    from softnic.core.output import ack_packet
    from softnic.wire.icrc import append_icrc
    qp = ea.qp
    return bytes(append_icrc(ack_packet(qp.attr.dest_qp_num, (qp.resp.epsn - 1) & 0xFFFFFF,
                                        0, qp.resp.msn), a.ip, qp.dest[0], a.port, qp.dest[1]))
