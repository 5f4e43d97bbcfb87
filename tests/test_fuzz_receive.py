"""Hostile input from the network: counted and dropped, never an exception.

Random well-formed-looking packets (every opcode, random headers, a valid
ICRC so they get past the integrity check) and random bytes are fed to a
device whose QPs are connected.  Whatever arrives, ``receive_datagram`` and
the output path must not raise, and memory the device was never given
(an unregistered canary buffer next to the registered one) stays untouched.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from softnic.core.device import Device
from softnic.core.enums import QPType
from softnic.core.memory import Buffer
from softnic.experiments.rig import connect
from softnic.wire.icrc import append_icrc
from softnic.wire.roce import OPCODES, encode

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)


@st.composite
def hostile_packets(draw, qpns: list[int]):
    info = OPCODES[draw(st.sampled_from(sorted(OPCODES)))]
    kw = dict(dest_qp=draw(st.one_of(st.sampled_from(qpns), st.integers(0, 0xFFFFFF))),
              psn=draw(st.one_of(st.integers(0, 3), st.integers(0, 0xFFFFFF))), ackreq=draw(st.booleans()),
              se=draw(st.booleans()))
    if info.reth:
        kw["reth"] = (draw(u64), draw(u32), draw(st.one_of(st.integers(0, 9000), u32)))
    if info.aeth:
        kw["aeth"] = (draw(st.integers(0, 255)), draw(st.integers(0, 0xFFFFFF)))
    if info.atomiceth:
        kw["atomiceth"] = (draw(u64), draw(u32), draw(u64), draw(u64))
    if info.atomicacketh:
        kw["atomicack"] = draw(u64)
    if info.immdt:
        kw["imm"] = draw(u32)
    if info.ieth:
        kw["ieth"] = draw(u32)
    if info.deth:
        kw["deth"] = (draw(u32), draw(st.integers(0, 0xFFFFFF)))
    if info.feth:             # FLUSH: any selectivity level and placement type, valid or not
        kw["feth"] = (draw(st.integers(0, 3)), draw(st.integers(0, 15)))
    if info.xrceth:           # any SRQ number: mostly none, sometimes one that exists
        kw["xrceth"] = draw(st.integers(0, 0xFFFFFF) | st.integers(0, 64))
    if info.payload:
        kw["payload"] = draw(st.binary(max_size=5000))
    return bytes(encode(info.opcode, **kw))


def _setup():
    a = Device("a", "10.0.0.1")
    b = Device("b", "10.0.0.2")
    rc = connect(a, b, qp_type=QPType.RC, mtu=1024, endpoint_args=dict(buf_size=1 << 16))
    uc = connect(a, b, qp_type=QPType.UC, mtu=1024, endpoint_args=dict(buf_size=1 << 16))
    ud = connect(a, b, qp_type=QPType.UD, endpoint_args=dict(buf_size=1 << 16))
    for ea, eb in (rc, uc, ud):
        from softnic.core.qp import RecvWR
        b.post_recv(eb.qp, RecvWR(1, [eb.sge(0, 8192)]))
    return a, b, [p[1].qp.qpn for p in (rc, uc, ud)] + [p[0].qp.qpn for p in (rc, uc, ud)]


A, B, QPNS = _setup()
CANARY = Buffer(1 << 16)
CANARY.view[:] = b"\xa5" * (1 << 16)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(hostile_packets(QPNS), min_size=1, max_size=20), st.booleans())
def test_hostile_packets_are_dropped_or_handled(pkts, from_peer):
    global A, B
    A, B, qpns = _setup()          # fresh QPs each time (same QPNs: the devices are new)
    assert qpns == QPNS
    src = A.address if from_peer else ("10.9.9.9", 4791)
    for p in pkts:
        data = append_icrc(bytearray(p), src[0], B.ip, src[1], B.port)
        B.receive_datagram(bytes(data), src, 0.0)
        B.datagrams_to_send(0.0)
        B.handle_timer(1.0)
    assert bytes(CANARY.view) == b"\xa5" * (1 << 16)


@given(st.binary(max_size=200))
def test_random_bytes_are_counted_and_dropped(data):
    before = B.counters["rcvd_icrc_err"] + B.counters["rcvd_malformed"]
    B.receive_datagram(data, A.address, 0.0)
    assert B.counters["rcvd_icrc_err"] + B.counters["rcvd_malformed"] == before + 1
