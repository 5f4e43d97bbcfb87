"""The common-case branches change nothing but speed.

The responder's ``receive_common`` takes in-sequence SENDs, WRITEs, READ requests
and ATOMICs, the completer's plain ACKs (``receive_common``) and a one-packet
READ response or ATOMIC ACKNOWLEDGE (``receive_answer_common``) from their bytes,
and dispatch's ``cnp_common`` CNPs,
through the same rules as the general path, without decoding a ``Packet``; the
requester packs ONLY and FIRST packets straight, builds bulk runs and leaves
``generate`` at once while a paced QP's pacer holds it
(``DeviceConfig(fast_path=False)`` turns all of it off: every packet is decoded
and dispatched, one at a time, and the send queue walked each time).  The
property here: the same random workload (test_engine_properties' scenarios,
posted one WR at a time with the fabric running between posts, over a faulty
link) run with the fast paths and without them puts the same bytes on the
wire at the same virtual times, and ends with the same completions, memory and
counters.  A failure prints the scenario, whose ``seed`` replays the fabric.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, note, settings, strategies as st

from softnic.core import dispatch, requester
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import Access, QPState, SendFlags, WCOpcode, WCStatus, WROpcode as W
from softnic.core.output import ack_packet, atomic_ack_packet, cnp_packet, read_response_only
from softnic.core.qp import RecvWR, SendWR
from softnic.experiments.rig import connect
from softnic.wire.roce import OPCODES, Opcode as O, encode

from test_engine_properties import _normalized_trace, run_scenario, scenarios, switched


def _outcome(r) -> dict:
    return dict(
        trace=_normalized_trace(r),
        wcs=[[(w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags) for w in p.got]
             for p in r["pairs"]],
        recv_wcs=[[(w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags)
                   for w in p.got_recv] for p in r["pairs"]],
        memory=[bytes(a.buf.view) for a in r["arenas"]],
        counters=[dict(d.counters) for d in r["devs"]],
    )


@settings(deadline=None, max_examples=30,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(max_size=9000), st.lists(st.sampled_from([0.0, 1e-6, 5e-6, 20e-6, 200e-6]),
                                          min_size=1, max_size=8))
def test_fast_paths_give_the_same_wire_and_results(s, gaps):
    _same_either_way(dict(s, gaps=gaps))


@settings(deadline=None, max_examples=30,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(max_size=256), st.lists(st.sampled_from([0.0, 1e-6, 5e-6, 20e-6, 200e-6]),
                                         min_size=1, max_size=8))
def test_one_packet_requests_of_every_opcode_the_same_either_way(s, gaps):
    """Every message of one packet (the MTU is at least 256 bytes): WRITEs, SENDs
    with and without immediate, READs and atomics, each request and its answer
    (ACK, READ RESPONSE ONLY, ATOMIC ACKNOWLEDGE) through the requester's packed
    ONLY and the common branches wherever their conditions hold, over a link that
    loses, duplicates, reorders and corrupts: the same wire and results as the
    general path (whose replays of duplicates and resends they leave to it)."""
    _same_either_way(dict(s, gaps=gaps))


def _same_either_way(s) -> None:
    note(f"replay with: run_scenario({s!r}, trace=True)")
    fast = _outcome(run_scenario(dict(s, fast_path=True), trace=True))
    slow = _outcome(run_scenario(dict(s, fast_path=False), trace=True))
    assert len(fast["trace"]) > 0
    for key in ("trace", "wcs", "recv_wcs", "counters", "memory"):
        assert fast[key] == slow[key], f"{key} differs with the fast paths"


@settings(deadline=None, max_examples=30,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(max_size=9000), switched(),
       st.lists(st.sampled_from([0.0, 1e-6, 5e-6, 20e-6, 200e-6]), min_size=1, max_size=8))
def test_fast_paths_give_the_same_results_with_congestion_control(s, net, gaps):
    """The same through a switch that marks (RED/ECN) and stamps INT, every QP
    running a congestion controller: the responder's common case takes a
    controlled QP's requests, CE-marked or carrying telemetry, and passes their
    signals on (``Device.request_signals``) as the general path does."""
    _same_either_way(dict(s, gaps=gaps, net=net))


def _pair(**cfg):
    a = Device("a", "10.0.0.1", config=DeviceConfig(**cfg))
    b = Device("b", "10.0.0.2", config=DeviceConfig(**cfg))
    ea, eb = connect(a, b, mtu=1024, timeout=14)
    return a, b, ea, eb


def _deliver(x, y, now=0.0) -> int:
    out = x.datagrams_to_send(now)
    for d, _ in out:
        y.receive_datagram(d, x.address, now)
    return len(out)


def _count_common(monkeypatch, taken: dict) -> None:
    """Count the common-case branches taken (they return True), by opcode name."""
    for op, real in list(dispatch._COMMON.items()):
        def counted(*args, _real=real, _name=O(op).name):
            ok = _real(*args)
            taken[_name] = taken.get(_name, 0) + ok
            return ok
        monkeypatch.setitem(dispatch._COMMON, op, counted)


def test_a_ping_pong_takes_the_fast_paths(monkeypatch):
    """The common-case branches are taken for a WRITE, a SEND with immediate and
    their ACKs, and the requester packs both ONLYs straight; data lands,
    completions are right."""
    taken: dict = {}
    _count_common(monkeypatch, taken)
    packed = []
    real_pack = requester._pack_only
    monkeypatch.setattr(requester, "_pack_only", lambda *a: packed.append(1) or real_pack(*a))
    walked = []
    real_send = requester._send_packet
    monkeypatch.setattr(requester, "_send_packet",
                        lambda *a: walked.append(a[2].opcode) or real_send(*a))
    a, b, ea, eb = _pair()
    ea.buf.view[:8] = b"pingpong"
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 8)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + 64, rkey=eb.mr.rkey))
    assert _deliver(a, b) == 1 and _deliver(b, a) == 1
    assert bytes(eb.buf.view[64:72]) == b"pingpong"
    [wc] = a.poll_cq(ea.send_cq, 4)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (1, WCStatus.SUCCESS,
                                                             WCOpcode.RDMA_WRITE, 8)
    b.post_recv(eb.qp, RecvWR(9, [eb.sge(256, 100)]))
    a.post_send(ea.qp, SendWR(2, W.SEND_WITH_IMM, [ea.sge(0, 5)], SendFlags.SIGNALED,
                              imm_data=0x01020304))
    assert _deliver(a, b) == 1 and _deliver(b, a) == 1
    [rwc] = b.poll_cq(eb.recv_cq, 4)
    assert (rwc.wr_id, rwc.status, rwc.opcode, rwc.byte_len, rwc.imm_data) == \
        (9, WCStatus.SUCCESS, WCOpcode.RECV, 5, 0x01020304)
    assert bytes(eb.buf.view[256:261]) == b"pingp"
    assert [w.wr_id for w in a.poll_cq(ea.send_cq, 4)] == [2]
    assert taken == {"RC_RDMA_WRITE_ONLY": 1, "RC_SEND_ONLY_WITH_IMMEDIATE": 1,
                     "RC_ACKNOWLEDGE": 2}
    assert len(packed) == 2
    assert walked == [W.RDMA_WRITE, W.SEND_WITH_IMM]    # one packet each, by the walk


def _one_packet_wrs(ea, eb) -> list:
    """One WR of every opcode that a one-packet request carries, 8 bytes each, the
    SEND_WITH_INV naming a key the peer does not have (its NAK ends the list)."""
    def remote(off):
        return dict(remote_addr=eb.buf.addr + off, rkey=eb.mr.rkey)
    sig = SendFlags.SIGNALED
    return [SendWR(1, W.RDMA_WRITE, [ea.sge(0, 8)], sig, **remote(64)),
            SendWR(2, W.RDMA_WRITE_WITH_IMM, [ea.sge(8, 8)], sig | SendFlags.SOLICITED,
                   imm_data=0xA1B2C3D4, **remote(72)),
            SendWR(3, W.SEND, [ea.sge(16, 7)], sig),
            SendWR(4, W.SEND_WITH_IMM, [ea.sge(24, 8)], sig | SendFlags.SOLICITED,
                   imm_data=0x01020304),
            SendWR(5, W.RDMA_READ, [ea.sge(512, 8)], sig, **remote(256)),
            SendWR(6, W.ATOMIC_FETCH_AND_ADD, [ea.sge(520, 8)], sig, compare_add=0x1111,
                   **remote(264)),
            SendWR(7, W.ATOMIC_CMP_AND_SWP, [ea.sge(528, 8)], sig,
                   compare_add=int.from_bytes(b"readable", "little"),
                   swap=0x5A5A5A5A5A5A5A5A, **remote(256)),
            SendWR(8, W.RDMA_READ, [ea.sge(536, 8)], sig, **remote(256)),
            SendWR(9, W.SEND_WITH_INV, [ea.sge(32, 8)], sig, invalidate_rkey=0x7777),
            SendWR(10, W.RDMA_WRITE, [ea.sge(0, 8)], sig, **remote(64))]


def _at_offset(d, base: int) -> bytes:
    """A datagram without its ICRC, a RETH's or AtomicETH's VA as an offset from
    ``base`` (buffers lie at other addresses in another run)."""
    info = OPCODES[d[0]]
    d = bytearray(d[:-4])
    if info.reth or info.atomiceth:
        d[12:20] = (int.from_bytes(d[12:20], "big") - base).to_bytes(8, "big", signed=True)
    return bytes(d)


def _one_packet_run(fast: bool, monkeypatch=None, taken=None, packed=None) -> dict:
    a, b, ea, eb = _pair(fast_path=fast)
    ea.buf.view[:40] = bytes(range(1, 41))
    eb.buf.view[256:272] = b"readable" + (0x2222).to_bytes(8, "little")
    for i in range(4):
        b.post_recv(eb.qp, RecvWR(100 + i, [eb.sge(1024 + 64 * i, 64)]))
    wire = []
    for wr in _one_packet_wrs(ea, eb):
        a.post_send(ea.qp, wr)
        for x, y in ((a, b), (b, a)):
            for d, _ in x.datagrams_to_send(0.0):
                wire.append(_at_offset(d, eb.buf.addr))
                y.receive_datagram(d, x.address, 0.0)

    def wcs(dev, cq):
        return [(w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data, w.wc_flags)
                for w in dev.poll_cq(cq, 32)]
    return dict(wire=wire, send=wcs(a, ea.send_cq), recv=wcs(b, eb.recv_cq),
                mem=(bytes(ea.buf.view[:4096]), bytes(eb.buf.view[:4096])),
                counters=(dict(a.counters), dict(b.counters)), states=(ea.qp.state, eb.qp.state))


def test_every_one_packet_opcode_takes_the_fast_paths_with_the_same_result(monkeypatch):
    """A WRITE, WRITE_WITH_IMM, SEND, SEND_WITH_IMM, READ, FETCH_ADD, CMP_SWAP and
    SEND_WITH_INV of one packet each, one after another: with the fast paths each
    request is packed straight (``_pack_only``) and taken by the responder's
    common branch, and each ACK, READ RESPONSE ONLY and ATOMIC ACKNOWLEDGE by the
    completer's; the same bytes on the wire, completions, memory, counters and
    QP states as with every packet decoded and dispatched."""
    slow = _one_packet_run(False)
    taken: dict = {}
    _count_common(monkeypatch, taken)
    packed = []
    real_pack = requester._pack_only
    monkeypatch.setattr(requester, "_pack_only",
                        lambda qp, wqe, *a: packed.append(wqe.wr_id) or real_pack(qp, wqe, *a))
    fast = _one_packet_run(True)
    for key in ("wire", "send", "recv", "mem", "counters", "states"):
        assert fast[key] == slow[key], f"{key} differs with the fast paths"
    assert packed == list(range(1, 10))
    assert taken == {"RC_RDMA_WRITE_ONLY": 1, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE": 1,
                     "RC_SEND_ONLY": 1, "RC_SEND_ONLY_WITH_IMMEDIATE": 1,
                     "RC_RDMA_READ_REQUEST": 2, "RC_FETCH_ADD": 1, "RC_COMPARE_SWAP": 1,
                     "RC_SEND_ONLY_WITH_INVALIDATE": 1, "RC_ACKNOWLEDGE": 4,
                     "RC_RDMA_READ_RESPONSE_ONLY": 2, "RC_ATOMIC_ACKNOWLEDGE": 2}
    send = fast["send"]
    assert [(w[0], w[1]) for w in send[:8]] == [(i, WCStatus.SUCCESS) for i in range(1, 9)]
    assert send[8][:2] == (9, WCStatus.REM_INV_REQ_ERR)     # NAKed: no such key to invalidate
    assert [w[:2] for w in send[9:]] == [(10, WCStatus.WR_FLUSH_ERR)]
    mem_a, mem_b = fast["mem"]
    assert mem_b[64:80] == bytes(range(1, 17))                       # the WRITEs
    assert mem_a[512:520] == b"readable"                             # the first READ
    assert int.from_bytes(mem_a[520:528], "little") == 0x2222        # FETCH_ADD's original
    assert mem_a[528:536] == b"readable"                             # CMP_SWAP's original
    assert mem_a[536:544] == (0x5A5A5A5A5A5A5A5A).to_bytes(8, "little")  # swapped: re-read
    assert mem_b[264:272] == (0x3333).to_bytes(8, "little")
    assert [w[0] for w in fast["recv"][:3]] == [100, 101, 102]


def test_a_bad_lkey_on_the_one_packet_path_fails_as_the_walk_fails_it():
    """A one-packet WRITE whose lkey is wrong (``_start`` refuses it): the WR
    completes with LOC_PROT_ERR, nothing is sent, and the next WR is flushed,
    exactly as with the fast paths off."""
    got = []
    for fast in (True, False):
        a, b, ea, eb = _pair(fast_path=fast)
        a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [(ea.buf.addr, 8, ea.mr.lkey ^ 0x5A)],
                                  SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                  rkey=eb.mr.rkey))
        sent = _deliver(a, b)
        a.post_send(ea.qp, SendWR(2, W.RDMA_WRITE, [ea.sge(0, 8)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
        sent += _deliver(a, b)
        got.append((sent, [(w.wr_id, w.status) for w in a.poll_cq(ea.send_cq, 4)],
                    ea.qp.state, dict(a.counters)))
    assert got[0] == got[1]
    assert got[0][0] == 0 and got[0][1][0] == (1, WCStatus.LOC_PROT_ERR)


def _bad_rkey_write(size: int) -> None:
    """A WRITE of ``size`` bytes with a bad rkey: NAKed (remote access error),
    memory untouched, the requester's completion says so."""
    a, b, ea, eb = _pair()
    before = bytes(eb.buf.view[:4096])
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, size)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey ^ 0xFF))
    _deliver(a, b)
    _deliver(b, a)
    [wc] = a.poll_cq(ea.send_cq, 4)
    assert wc.status == WCStatus.REM_ACCESS_ERR
    assert b.counters["resp_nak_remote_access_error"] == 1
    assert bytes(eb.buf.view[:4096]) == before


def test_errors_are_refused_by_the_same_rules_either_way():
    """A bad rkey (NAK), a missing receive (RNR NAK) and a corrupted ICRC (counted,
    dropped): the rules the general path applies, whichever way the packet came in."""
    # bad rkey: NAK remote access error, memory untouched, requester's WC says so
    _bad_rkey_write(8)
    # corrupted ICRC: counted and dropped
    a, b, ea, eb = _pair()
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 8)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    [(d, _)] = a.datagrams_to_send(0.0)
    bad = bytearray(d)
    bad[-1] ^= 1
    b.receive_datagram(bytes(bad), a.address, 0.0)
    assert b.counters["rcvd_icrc_err"] == 1 and b.qps[eb.qp.qpn].resp.epsn == 0
    # SEND with no receive posted: RNR NAK, nothing consumed
    a, b, ea, eb = _pair()
    a.post_send(ea.qp, SendWR(1, W.SEND, [ea.sge(0, 8)], SendFlags.SIGNALED))
    _deliver(a, b)
    assert b.counters["send_rnr_err"] == 1
    assert eb.qp.state == QPState.RTS and eb.qp.resp.epsn == 0


def test_a_long_writes_first_takes_the_common_branch_a_bad_one_is_naked_there(monkeypatch):
    """A multi-packet WRITE's FIRST, MIDDLE and LAST take the responder's common
    branch; a FIRST with a bad rkey is refused there by the same access rule
    (``write_target``): NAKed, memory untouched."""
    taken: dict = {}
    _count_common(monkeypatch, taken)
    a, b, ea, eb = _pair()
    ea.buf.view[0:3000] = bytes(range(250)) * 12
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 3000)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + 64, rkey=eb.mr.rkey))
    _deliver(a, b)
    _deliver(b, a)
    [wc] = a.poll_cq(ea.send_cq, 4)
    assert wc.status == WCStatus.SUCCESS
    assert taken == {"RC_RDMA_WRITE_FIRST": 1, "RC_RDMA_WRITE_MIDDLE": 1,
                     "RC_RDMA_WRITE_LAST": 1, "RC_ACKNOWLEDGE": 1}
    assert bytes(eb.buf.view[64:3064]) == bytes(ea.buf.view[0:3000])
    _bad_rkey_write(3000)
    assert taken["RC_RDMA_WRITE_FIRST"] == 2


def test_ack_packet_is_what_encode_builds():
    for psn, syn, msn in ((0, 0x1F, 0), (0xFFFFFF, 0x60, 0xABCDEF), (12345, 0x3F, 7)):
        assert ack_packet(0x123456, psn, syn, msn) == \
            encode(O.RC_ACKNOWLEDGE, dest_qp=0x123456, psn=psn, aeth=(syn, msn))


@settings(deadline=None, max_examples=60)
@given(st.integers(0, 0xFFFFFF), st.integers(0, 0xFFFFFF), st.integers(0, 0xFFFFFF),
       st.binary(max_size=70), st.integers(0, 2**64 - 1))
def test_read_response_only_and_atomic_ack_are_what_encode_builds(dqpn, psn, msn, data, orig):
    assert read_response_only(dqpn, psn, msn, memoryview(data)) == \
        encode(O.RC_RDMA_READ_RESPONSE_ONLY, dest_qp=dqpn, psn=psn, aeth=(0x1F, msn),
               payload=data)
    assert atomic_ack_packet(dqpn, psn, msn, orig) == \
        encode(O.RC_ATOMIC_ACKNOWLEDGE, dest_qp=dqpn, psn=psn, aeth=(0x1F, msn), atomicack=orig)


def test_cnp_packet_is_what_encode_builds():
    for dqpn in (0, 1, 0x123456, 0xFFFFFF):
        assert cnp_packet(dqpn) == encode(O.CNP, dest_qp=dqpn, psn=0)


def test_many_small_then_one_large_write_same_bytes_either_way():
    """The requester's ACK-request cadence (every window/4 packets) counts the
    packed ONLYs too: after 40 one-packet WRITEs a long WRITE asks for
    ACKs on the same packets with or without the fast paths."""
    wires = []
    for fast in (True, False):
        a, b, ea, eb = _pair(fast_path=fast)
        wire = []
        for i in range(40):
            a.post_send(ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(0, 8)], 0,
                                      remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
            out = a.datagrams_to_send(0.0)
            wire += [d for d, _ in out]
            for d, _ in out:
                b.receive_datagram(d, a.address, 0.0)
            _deliver(b, a)
        a.post_send(ea.qp, SendWR(99, W.RDMA_WRITE, [ea.sge(0, 20000)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
        wire += [d for d, _ in a.datagrams_to_send(0.0)]
        wires.append([bytes(d[:12]) for d in wire])      # BTHs (RETH VAs differ per run)
    assert len(wires[0]) == 40 + 20
    assert wires[0] == wires[1]


def test_engine_pingpong_tool_runs_both_ways(capsys):
    """tools/engine_pingpong.py (the benchmark docs/performance.md quotes) runs
    with and without the fast paths and prints a figure for each."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "tools" / "engine_pingpong.py"
    spec = importlib.util.spec_from_file_location("engine_pingpong", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["-n", "70"]) == 0
    assert mod.main(["-n", "70", "--no-fast-path"]) == 0
    for op in ("send", "read", "atomic"):
        assert mod.main(["-n", "70", "--op", op, "--cpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and "fast paths" in out[0] and "general path" in out[1]
    assert [line.split()[3] for line in out[2:]] == ["SEND", "READ", "ATOMIC"]
    assert all("CPU time" in line for line in out[2:])
    assert all(float(line.split(": ")[1].split()[0]) > 0 for line in out)


def test_engine_send_tool_runs_and_prints_its_split(capsys):
    """tools/engine_send.py (docs/performance.md quotes its split) runs and prints
    the sender's CPU per SEND, then its post and build apart and the receiver's,
    in the sender's best round and in its own (figures only: the split's clock is
    the wall's, which a loaded machine stretches)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "tools" / "engine_send.py"
    spec = importlib.util.spec_from_file_location("engine_send", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["-s", "8255", "-n", "64", "--rounds", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "sender CPU per 8255-byte SEND" in out[0]
    sender = float(out[0].split("SEND ")[1].split()[0])
    post = float(out[1].split("post ")[1].split()[0])
    build = float(out[1].split("build ")[1].split()[0])
    rx = float(out[1].split("receiver ")[1].split()[0])
    rx_best = float(out[1].split("its own best round ")[1].split()[0])
    assert sender > 0 and post > 0 and build > 0 and rx > 0
    assert 0 < rx_best <= rx        # (the receiver's best of the rounds, that one among them)


def test_routes_cover_every_opcode_and_send_each_to_its_side():
    """``dispatch.ROUTES`` has every opcode ``wire.roce`` knows; requests go to the
    responder, responses to the completer, CNPs to the controller; the only
    common-case branches are the responder's for RC SENDs, WRITEs, READ requests
    and ATOMICs, the completer's for the RC ACK, the READ RESPONSE ONLY and the
    ATOMIC ACKNOWLEDGE, and dispatch's own for the CNP."""
    from softnic.core import completer, responder
    from softnic.wire.roce import Kind, OPCODES
    assert set(dispatch.ROUTES) == set(OPCODES)
    for op, route in dispatch.ROUTES.items():
        info = OPCODES[op]
        assert route.info is info
        if info.kind == Kind.CNP:
            assert route.side is dispatch.Side.CNP
            assert route.common is dispatch.cnp_common
            continue
        if info.is_request:
            assert route.side is dispatch.Side.REQUEST
        else:
            assert route.side is dispatch.Side.RESPONSE
        rc_request = info.qp_type == "RC" and info.kind in (Kind.SEND, Kind.WRITE,
                                                            Kind.READ_REQUEST, Kind.ATOMIC)
        if rc_request:
            assert route.common is responder.receive_common, info.name
        elif op == O.RC_ACKNOWLEDGE:
            assert route.common is completer.receive_common
        elif op in (O.RC_RDMA_READ_RESPONSE_ONLY, O.RC_RDMA_READ_RESPONSE_FIRST,
                    O.RC_RDMA_READ_RESPONSE_LAST, O.RC_ATOMIC_ACKNOWLEDGE):
            assert route.common is completer.receive_answer_common
        else:
            assert route.common is None, info.name


@settings(deadline=None, max_examples=30,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios(max_size=20000), st.sampled_from(["dcqcn", "timely", "dcqcn:t_dec=0"]),
       st.sampled_from([1e9, 2e9]), st.booleans(),
       st.lists(st.sampled_from([0.0, 1e-6, 5e-6, 20e-6]), min_size=1, max_size=8),
       st.sampled_from([2, 5, 128]))
def test_a_paced_requester_stops_early_only_where_nothing_changes(s, cc, rate, marks, gaps,
                                                                   window):
    """A rate-paced QP (each packet ``bytes * 8 / rate`` after the last, so nearly
    every packet waits for the pacer) is made ready by ACKs, CNPs and its
    controller's timers while its pacer holds it; ``requester.generate`` then stops
    at once (``held_by_pacer``) without walking the send queue, and when its
    pacer lets a MIDDLE go, its chain sends it and stops at the window or the
    pacer.  Through a slow switch that marks every queued packet
    (``marks``: many CNPs and rate cuts) or none, with a window of a few packets
    or the default, the same wire and results as the general path's full walk."""
    net = dict(cc=cc, rates=(rate, rate), kmin=0 if marks else 10**9,
               kspan=1_000, pmax=1.0, buffer=None, int_telemetry=False, window=window)
    _same_either_way(dict(s, gaps=gaps, net=net))


def test_a_long_reads_request_and_its_first_and_last_take_the_fast_paths(monkeypatch):
    """A READ of three responses: its request packed straight (one packet for all
    its PSNs), its RESPONSE FIRST and LAST taken by ``receive_answer_common``, the
    data in place and the completion right."""
    taken: dict = {}
    _count_common(monkeypatch, taken)
    packed = []
    real_pack = requester._pack_only
    monkeypatch.setattr(requester, "_pack_only", lambda *a: packed.append(1) or real_pack(*a))
    a, b, ea, eb = _pair()
    eb.buf.view[100:3100] = bytes(range(250)) * 12
    a.post_send(ea.qp, SendWR(7, W.RDMA_READ, [ea.sge(0, 3000)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + 100, rkey=eb.mr.rkey))
    assert _deliver(a, b) == 1 and packed == [1]
    assert _deliver(b, a) == 3
    assert taken == {"RC_RDMA_READ_REQUEST": 1, "RC_RDMA_READ_RESPONSE_FIRST": 1,
                     "RC_RDMA_READ_RESPONSE_LAST": 1}
    assert bytes(ea.buf.view[0:3000]) == bytes(eb.buf.view[100:3100])
    [wc] = a.poll_cq(ea.send_cq, 4)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (7, WCStatus.SUCCESS,
                                                             WCOpcode.RDMA_READ, 3000)


def test_a_reads_responses_out_of_order_go_the_general_way_with_the_same_result(monkeypatch):
    """The READ's LAST before its FIRST: the first branch declines it (not the next
    PSN to be acknowledged), and the general path finds the gap and issues the
    READ again from its first response; the FIRST that follows is in order and
    taken by the first branch.  Either way, the same packets, counters,
    completions and memory."""
    got = []
    for fast in (True, False):
        taken: dict = {}
        with monkeypatch.context() as m:
            _count_common(m, taken)
            a, b, ea, eb = _pair(fast_path=fast)
            eb.buf.view[0:3000] = bytes(range(200)) * 15
            a.post_send(ea.qp, SendWR(7, W.RDMA_READ, [ea.sge(0, 3000)], SendFlags.SIGNALED,
                                      remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
            assert _deliver(a, b) == 1
            first, middle, last = (d for d, _ in b.datagrams_to_send(0.0))
            for d in (last, first, middle):
                a.receive_datagram(d, b.address, 0.0)
            # the READ issued again: its BTH and RETH length (its address and key are
            # this pair's own)
            again = [(bytes(d[:12]), bytes(d[24:28]), len(d)) for d, _ in a.datagrams_to_send(0.0)]
            got.append((again, dict(a.counters), a.poll_cq(ea.send_cq, 4),
                        bytes(ea.buf.view[0:3000])))
        if fast:
            assert taken.get("RC_RDMA_READ_RESPONSE_LAST") == 0
            assert taken.get("RC_RDMA_READ_RESPONSE_FIRST") == 1
    assert got[0][1]["completer_retry_err"] == 1 and len(got[0][0]) == 1
    assert got[0] == got[1]


def _coalesced(fast: bool, read: str, monkeypatch=None, taken=None) -> dict:
    """Four WRITEs and SENDs (one, two, three and one packets; ``read`` "answered"
    or "lost": a READ after the second, its response delivered or lost; "": no
    READ) posted
    at once and delivered, the responder's ACKs coalesced (a later plain ACK
    covers an earlier one), then its answers delivered: what the requester
    makes of them."""
    if taken is not None:
        _count_common(monkeypatch, taken)
    a, b, ea, eb = _pair(fast_path=fast)
    ea.buf.view[0:4000] = bytes(range(200)) * 20
    eb.buf.view[8000:8008] = b"readthis"
    b.post_recv(eb.qp, RecvWR(9, [eb.sge(4096, 2000)]))
    wrs = [SendWR(1, W.RDMA_WRITE, [ea.sge(0, 100)], SendFlags.SIGNALED,
                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey),
           SendWR(2, W.SEND, [ea.sge(100, 2000)], SendFlags.SIGNALED)]
    if read:
        wrs.append(SendWR(4, W.RDMA_READ, [ea.sge(6000, 8)], SendFlags.SIGNALED,
                          remote_addr=eb.buf.addr + 8000, rkey=eb.mr.rkey))
    wrs += [SendWR(3, W.RDMA_WRITE, [ea.sge(0, 3000)], SendFlags.SIGNALED,
                   remote_addr=eb.buf.addr + 100, rkey=eb.mr.rkey),
            SendWR(5, W.RDMA_WRITE, [ea.sge(0, 10)], SendFlags.SIGNALED,
                   remote_addr=eb.buf.addr + 3200, rkey=eb.mr.rkey)]
    for wr in wrs:
        a.post_send(ea.qp, wr)
    _deliver(a, b)
    answers = [bytes(d) for d, _ in b.datagrams_to_send(0.0)]
    for d in answers:
        if read != "lost" or d[0] != O.RC_RDMA_READ_RESPONSE_ONLY:
            a.receive_datagram(d, b.address, 0.0)
    return dict(answers=answers,
                wcs=[(w.wr_id, w.status, w.opcode, w.byte_len) for w in a.poll_cq(ea.send_cq, 8)],
                counters=dict(a.counters), memory=bytes(ea.buf.view[:8192]),
                acked=ea.qp.comp.acked_psn, sq=len(ea.qp.sq),
                out=[(d[0], bytes(d[8:12])) for d, _ in a.datagrams_to_send(0.0)])


def test_a_coalesced_ack_of_several_sends_and_writes_takes_the_common_branch(monkeypatch):
    """One ACK for several messages (a responder coalesces the ACKs it owes): the
    completer's first branch takes it (``_ack_before`` completes those before
    the one its PSN is in), with the completions, state, counters and resends
    of the general path.  While a READ is outstanding the branch declines
    such an ACK (a READ before its PSN waits for its response, and one whose
    response was lost is sent again: ``receive`` decides)."""
    wc = {1: (WCOpcode.RDMA_WRITE, 100), 2: (WCOpcode.SEND, 2000),
          3: (WCOpcode.RDMA_WRITE, 3000), 4: (WCOpcode.RDMA_READ, 8),
          5: (WCOpcode.RDMA_WRITE, 10)}
    for read in ("", "answered", "lost"):
        taken: dict = {}
        fast = _coalesced(True, read, monkeypatch, taken)
        monkeypatch.undo()
        taken = {k: n for k, n in taken.items() if "ACK" in k or "RESPONSE" in k}
        assert fast == _coalesced(False, read)
        if not read:                    # one ACK for all four
            assert len(fast["answers"]) == 1 and taken == {"RC_ACKNOWLEDGE": 1}
            assert fast["wcs"] == [(i, WCStatus.SUCCESS, *wc[i]) for i in (1, 2, 3, 5)]
        elif read == "answered":        # ACK of 1-2 (past the oldest, a READ outstanding:
            assert len(fast["answers"]) == 3            # declined), the READ's, ACK of 3-5
            assert taken == {"RC_ACKNOWLEDGE": 1, "RC_RDMA_READ_RESPONSE_ONLY": 1}
            assert fast["memory"][6000:6008] == b"readthis"
            assert fast["wcs"] == [(i, WCStatus.SUCCESS, *wc[i]) for i in (1, 2, 4, 3, 5)]
        else:                           # the READ's response lost: it is asked again
            assert taken == {"RC_ACKNOWLEDGE": 0}
            assert fast["wcs"] == [(i, WCStatus.SUCCESS, *wc[i]) for i in (1, 2)]
            assert [op for op, _ in fast["out"]][:1] == [O.RC_RDMA_READ_REQUEST]
