"""softnic.testing: the public Hypothesis strategies, DropList, and the ring buffer example.

Shrinking is checked with ``hypothesis.find``: the minimal example that
satisfies a predicate must be the plain one (a perfect link, no drops, a
zero-length WRITE, the default QP attributes) plus only what the predicate
forces.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, find, given, note, settings, strategies as st
from hypothesis.errors import InvalidArgument

from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import QPState, WCFlags, WCOpcode, WCStatus, WROpcode as W, mtu_bytes
from softnic.core.qp import RecvWR
from softnic.driver.faults import COUNTER_NAMES, DEFAULT_QUEUE_BYTES, FaultModel
from softnic.testing import (RC_OPCODES, DropList, QPAttrs, WorkRequest, describe_datagram,
                             fault_models, loss_patterns, qp_attrs, work_requests)
from softnic.transport.sim import Fabric

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ring_buffer_property.py"
A = ("10.0.0.1", 4791)
B = ("10.0.0.2", 4791)

FAST = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def minimal(strategy, predicate=lambda x: True):
    return find(strategy, predicate, settings=settings(database=None, max_examples=2000,
                                                       phases=[Phase.generate, Phase.shrink]))


# -- fault_models ---------------------------------------------------------------


@FAST
@given(fault_models(rates=(1e8, 1e10)))
def test_fault_models_are_valid_and_within_bounds(m):
    assert isinstance(m, FaultModel)
    assert FaultModel(**vars(m)) == m                 # passes FaultModel's own validation
    assert 0 <= m.loss <= 0.1
    assert m.p_enter_bad <= 0.05 and m.p_leave_bad >= 0.1 and m.loss_bad > 0
    assert m.reorder <= 0.05 and m.reorder_delay <= 50e-6
    assert (m.reorder > 0) == (m.reorder_delay > 0)
    assert m.duplicate <= 0.05 and m.corrupt <= 0.05 and 1 <= m.corrupt_bits <= 4
    assert m.delay <= 20e-6 and m.jitter <= 10e-6
    assert m.rate_bps is None or 1e8 <= m.rate_bps <= 1e10
    assert 0 <= m.queue_bytes <= DEFAULT_QUEUE_BYTES
    assert FaultModel.parse(str(m)) == m             # prints as a --faults spec


@FAST
@given(fault_models(max_loss=0, bursts=False, max_reorder=0, max_duplicate=0, max_corrupt=0,
                    max_delay=0, max_jitter=0))
def test_fault_models_with_every_maximum_zero_is_a_perfect_link(m):
    assert m == FaultModel.none()


def test_fault_models_cover_every_fault():
    seen = set()

    @settings(max_examples=300, database=None)
    @given(fault_models(rates=(1e9, 1e9)))
    def collect(m):
        seen.update(k for k in ("loss", "p_enter_bad", "reorder", "duplicate", "corrupt",
                                "delay", "jitter") if getattr(m, k))
        if m.rate_bps:
            seen.add("rate_bps")

    collect()
    assert seen == {"loss", "p_enter_bad", "reorder", "duplicate", "corrupt", "delay",
                    "jitter", "rate_bps"}


def test_fault_models_shrink_to_a_perfect_link():
    assert minimal(fault_models()) == FaultModel.none()
    assert minimal(fault_models(rates=(1e8, 1e10))) == FaultModel.none()


@pytest.mark.parametrize("predicate, expected", [
    (lambda m: m.loss > 0, FaultModel(loss=1e-6)),
    (lambda m: m.loss >= 0.05, FaultModel(loss=0.05)),
    (lambda m: m.p_enter_bad > 0, FaultModel(p_enter_bad=1e-6)),
    (lambda m: m.duplicate > 0 and m.corrupt > 0, FaultModel(duplicate=1e-6, corrupt=1e-6)),
    (lambda m: m.corrupt_bits > 2, FaultModel(corrupt=1e-6, corrupt_bits=3)),
    (lambda m: m.reorder > 0, FaultModel(reorder=1e-6, reorder_delay=1e-9)),
    (lambda m: m.delay >= 15e-6, FaultModel(delay=15e-6)),
    (lambda m: m.jitter > 0, FaultModel(jitter=1e-9)),
])
def test_fault_models_shrink_to_only_the_faults_needed(predicate, expected):
    assert minimal(fault_models(), predicate) == expected


def test_fault_models_shrink_a_burst_toward_the_mildest_chain():
    m = minimal(fault_models(), lambda m: m.p_enter_bad > 0 and m.p_leave_bad < 0.5)
    assert m == FaultModel(p_enter_bad=1e-6, p_leave_bad=0.499999)


@pytest.mark.parametrize("kwargs", [dict(max_loss=1.5), dict(max_loss=-0.1), dict(max_delay=-1.0),
                                    dict(max_corrupt_bits=0), dict(rates=(0, 1e9)),
                                    dict(rates=(1e9, 1e8)), dict(max_reorder_delay=1e-12)])
def test_fault_models_reject_bad_arguments(kwargs):
    with pytest.raises(InvalidArgument):
        fault_models(**kwargs)


# -- loss_patterns ----------------------------------------------------------------


@FAST
@given(st.data())
def test_loss_patterns_stay_in_range(data):
    n = data.draw(st.integers(0, 60))
    hi = data.draw(st.none() | st.integers(0, 5))
    lo = data.draw(st.integers(0, min(n, hi if hi is not None else 5)))
    drops = data.draw(loss_patterns(n, min_drops=lo, max_drops=hi))
    assert isinstance(drops, frozenset)
    assert all(isinstance(i, int) and 0 <= i < n for i in drops)
    assert lo <= len(drops) and (hi is None or len(drops) <= hi)


def test_loss_patterns_shrink_to_the_fewest_earliest_drops():
    assert minimal(loss_patterns(40)) == frozenset()
    assert minimal(loss_patterns(40), lambda s: len(s) >= 2) == {0, 1}
    assert minimal(loss_patterns(40), lambda s: any(i >= 17 for i in s)) == {17}
    assert minimal(loss_patterns(40), lambda s: {3, 7} <= s) == {3, 7}
    assert minimal(loss_patterns(0)) == frozenset()


@pytest.mark.parametrize("args, kwargs", [((-1,), {}), ((3,), dict(min_drops=4)),
                                          ((10,), dict(min_drops=3, max_drops=2))])
def test_loss_patterns_reject_bad_arguments(args, kwargs):
    with pytest.raises(InvalidArgument):
        loss_patterns(*args, **kwargs)


# -- DropList -------------------------------------------------------------------------


@FAST
@given(drops=loss_patterns(50), n=st.integers(0, 60))
def test_droplist_drops_exactly_the_listed_send_indices(drops, n):
    inj = DropList(drops)
    delivered = []
    for i in range(n):
        data = i.to_bytes(2, "big")
        out = inj.apply(data, i * 1e-6)
        assert out in ([], [(i * 1e-6, data)])
        if out:
            delivered.append(i)
    assert delivered == [i for i in range(n) if i not in drops]
    assert [i for i, _, _ in inj.dropped] == sorted(i for i in drops if i < n)
    c = inj.counters
    assert set(c) == set(COUNTER_NAMES)
    assert (c["sent"], c["delivered"], c["dropped_loss"]) == (n, len(delivered), n - len(delivered))
    assert inj.unused == {i for i in drops if i >= n}


def test_droplist_rejects_non_indices():
    for bad in ([-1], [1.0], [True], ["3"]):
        with pytest.raises(ValueError):
            DropList(bad)
    assert repr(DropList({7, 3})) == "DropList([3, 7])"


class Toy:
    def __init__(self, address):
        self.address = address
        self.outbox, self.inbox = [], []

    def receive_datagram(self, data, src, now):
        self.inbox.append(data)

    def datagrams_to_send(self, now):
        out, self.outbox = self.outbox, []
        return out

    def get_timer(self):
        return None

    def handle_timer(self, now):
        pass


def test_droplist_on_one_direction_of_a_fabric():
    fabric = Fabric(0, default_delay=1e-6)
    a, b = Toy(A), Toy(B)
    fabric.attach(a)
    fabric.attach(b)
    drops = DropList({3, 7}).install(fabric, A, B)
    a.outbox = [(bytes([i]), B) for i in range(10)]
    b.outbox = [(bytes([i]), A) for i in range(10)]
    fabric.run()
    assert b.inbox == [bytes([i]) for i in range(10) if i not in (3, 7)]
    assert a.inbox == [bytes([i]) for i in range(10)]
    assert fabric.injector(A, B) is drops
    assert fabric.link_counters(A, B)["dropped_loss"] == 2
    assert fabric.counters["dropped_loss"] == 2 and fabric.counters["received"] == 18
    assert [d for _, _, d in drops.dropped] == [b"\x03", b"\x07"]


def test_droplist_on_engine_traffic_names_the_dropped_packets():
    cfg = DeviceConfig(min_timer=50e-6)
    a, b = Device("a", A[0], config=cfg), Device("b", B[0], config=cfg)
    fabric = Fabric(0, default_delay=2e-6)
    fabric.attach(a)
    fabric.attach(b)
    ab = DropList({0, 1}).install(fabric, A, B)     # the WRITE and its retransmission
    ba = DropList().install(fabric, B, A)
    ea, eb = QPAttrs(psn_a=0xFFFFFF, timeout=4).connect(a, b, endpoint_args=dict(buf_size=4096))
    ea.buf.view[:5] = b"hello"
    wr = WorkRequest(W.RDMA_WRITE, length=5, remote_offset=100)
    a.post_send(ea.qp, wr.to_send_wr(1, local_addr=ea.buf.addr, lkey=ea.mr.lkey,
                                     remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    wcs = []
    fabric.run(until=1.0, stop=lambda: bool(wcs.extend(a.poll_cq(ea.send_cq, 4)) or wcs))
    assert [(w.wr_id, w.status) for w in wcs] == [(1, WCStatus.SUCCESS)]
    assert bytes(eb.buf.view[100:105]) == b"hello"
    lines = ab.describe()
    assert len(lines) == 2
    assert lines[0] == "#0 at 0.000 us: RC_RDMA_WRITE_ONLY qp 0x11 psn 16777215 5 B"
    assert lines[1].startswith("#1 at ") and lines[1].endswith(
        "RC_RDMA_WRITE_ONLY qp 0x11 psn 16777215 5 B")
    assert ba.dropped == [] and ba.counters["delivered"] >= 1
    assert a.counters["timeouts"] == 2
    assert describe_datagram(b"junk") == "4 bytes, not a RoCE packet"


# -- work_requests ----------------------------------------------------------------------


def _in_bounds(wr: WorkRequest, local_size: int, remote_size: int) -> None:
    assert 0 <= wr.local_offset and wr.local_offset + wr.length <= local_size
    if wr.opcode in (W.SEND, W.SEND_WITH_IMM):
        assert wr.remote_offset == 0
    else:
        assert 0 <= wr.remote_offset and wr.remote_offset + wr.length <= remote_size
    if wr.is_atomic:
        assert wr.length == 8 and wr.remote_offset % 8 == 0
        assert 0 <= wr.compare_add < 2**64 and 0 <= wr.swap < 2**64
        if wr.opcode == W.ATOMIC_FETCH_AND_ADD:
            assert wr.swap == 0
    else:
        assert wr.compare_add == wr.swap == 0
    if wr.opcode in (W.SEND_WITH_IMM, W.RDMA_WRITE_WITH_IMM):
        assert 0 <= wr.imm_data < 2**32
    else:
        assert wr.imm_data == 0
    assert wr.consumes_recv == (wr.opcode in (W.SEND, W.SEND_WITH_IMM, W.RDMA_WRITE_WITH_IMM))


@FAST
@given(st.data())
def test_work_requests_lie_within_the_buffers(data):
    local = data.draw(st.integers(0, 5000), "local")
    remote = data.draw(st.integers(8, 5000), "remote")
    disjoint = data.draw(st.booleans(), "disjoint")
    wrs = data.draw(work_requests(local, remote_buffer_size=remote, max_size=12, max_inline=64,
                                  unsignaled=True, fences=True, disjoint=disjoint))
    assert 1 <= len(wrs) <= 12
    assert wrs[-1].signaled
    for wr in wrs:
        assert wr.opcode in RC_OPCODES
        _in_bounds(wr, local, remote)
        assert not wr.inline or (wr.length <= 64 and not wr.is_atomic and wr.opcode != W.RDMA_READ)
    if disjoint:
        spans = sorted((w.local_offset, w.local_offset + w.length) for w in wrs)
        assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
        spans = sorted((w.remote_offset, w.remote_offset + w.length) for w in wrs
                       if w.opcode not in (W.SEND, W.SEND_WITH_IMM))
        assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))


def test_work_requests_cover_every_rc_opcode_inline_unsignaled_and_fenced():
    seen = set()

    @settings(max_examples=200, database=None)
    @given(work_requests(max_inline=64, unsignaled=True, fences=True))
    def collect(wrs):
        for w in wrs:
            seen.add(w.opcode)
            seen.update(k for k in ("inline", "fence") if getattr(w, k))
            if not w.signaled:
                seen.add("unsignaled")

    collect()
    assert seen == set(RC_OPCODES) | {"inline", "fence", "unsignaled"}


def test_work_requests_shrink_to_one_empty_write():
    assert minimal(work_requests()) == [WorkRequest(W.RDMA_WRITE)]
    assert minimal(work_requests(), lambda ws: any(w.is_atomic for w in ws)) == \
        [WorkRequest(W.ATOMIC_FETCH_AND_ADD, length=8)]
    assert minimal(work_requests(), lambda ws: any(w.opcode == W.RDMA_READ for w in ws)) == \
        [WorkRequest(W.RDMA_READ)]
    assert minimal(work_requests(), lambda ws: len(ws) >= 3) == [WorkRequest(W.RDMA_WRITE)] * 3
    assert minimal(work_requests(), lambda ws: any(w.length > 100 for w in ws)) == \
        [WorkRequest(W.RDMA_WRITE, length=101)]


def test_work_requests_options():
    only = minimal(work_requests(opcodes=[W.SEND_WITH_IMM]))
    assert only == [WorkRequest(W.SEND_WITH_IMM)]
    # buffers too small for an atomic: atomics are left out, not generated out of bounds
    assert minimal(work_requests(4, opcodes=[W.RDMA_WRITE, W.ATOMIC_CMP_AND_SWP]),
                   lambda ws: len(ws) >= 4) == [WorkRequest(W.RDMA_WRITE)] * 4
    with pytest.raises(InvalidArgument):
        work_requests(4, opcodes=[W.ATOMIC_FETCH_AND_ADD])
    with pytest.raises(InvalidArgument):
        work_requests(opcodes=[W.BIND_MW])
    with pytest.raises(InvalidArgument):
        work_requests(opcodes=[])
    with pytest.raises(InvalidArgument):
        work_requests(min_size=3, max_size=2)
    wr = WorkRequest(W.ATOMIC_CMP_AND_SWP, 8, 16, 24, compare_add=5, swap=6, signaled=False,
                     fence=True)
    s = wr.to_send_wr(9, local_addr=1000, lkey=11, remote_addr=2000, rkey=22)
    assert (s.wr_id, s.opcode, s.sg_list, s.remote_addr, s.rkey, s.compare_add, s.swap) == \
        (9, W.ATOMIC_CMP_AND_SWP, [(1016, 8, 11)], 2024, 22, 5, 6)
    assert s.send_flags == 1        # FENCE only


LOCAL, REMOTE = 2048, 2048


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(wrs=work_requests(LOCAL, remote_buffer_size=REMOTE, max_size=6, max_inline=64,
                         fences=True, disjoint=True),
       attrs=qp_attrs(retry_cnt=7, timeout=range(1, 10)),
       drops_ab=loss_patterns(12, max_drops=3), drops_ba=loss_patterns(12, max_drops=3))
def test_generated_wrs_run_on_the_engine_as_a_reference_model_says(wrs, attrs, drops_ab, drops_ba):
    """The strategies end to end: WRs, QP attributes and drop patterns from this
    module, executed by two engine devices, against a byte-exact model."""
    cfg = DeviceConfig(min_timer=50e-6)
    a, b = Device("a", A[0], config=cfg), Device("b", B[0], config=cfg)
    fabric = Fabric(1, default_delay=2e-6)
    fabric.attach(a)
    fabric.attach(b)
    DropList(drops_ab).install(fabric, A, B)
    DropList(drops_ba).install(fabric, B, A)
    recv_area = sum(w.length for w in wrs)
    ea, eb = attrs.connect(a, b, endpoint_args=dict(buf_size=LOCAL + REMOTE + recv_area + 8))
    a_mem = bytes(range(256)) * (ea.buf.length // 256 + 1)
    ea.buf.view[:] = a_mem[:ea.buf.length]
    eb.buf.view[:] = bytes(reversed(a_mem))[:eb.buf.length]
    local, remote = bytearray(ea.buf.view[:LOCAL]), bytearray(eb.buf.view[:REMOTE])
    recv_at, recvs = REMOTE, []
    for i, w in enumerate(wrs):
        lo, ro, n = w.local_offset, w.remote_offset, w.length
        if w.opcode in (W.RDMA_WRITE, W.RDMA_WRITE_WITH_IMM):
            remote[ro:ro + n] = local[lo:lo + n]
        elif w.opcode == W.RDMA_READ:
            local[lo:lo + n] = remote[ro:ro + n]
        elif w.is_atomic:
            orig = int.from_bytes(remote[ro:ro + 8], sys.byteorder)
            local[lo:lo + 8] = remote[ro:ro + 8]
            if w.opcode == W.ATOMIC_FETCH_AND_ADD:
                new = (orig + w.compare_add) % 2**64
            else:
                new = w.swap if orig == w.compare_add else orig
            remote[ro:ro + 8] = new.to_bytes(8, sys.byteorder)
        if w.consumes_recv:
            sg = [] if w.opcode == W.RDMA_WRITE_WITH_IMM else [(eb.buf.addr + recv_at, n,
                                                                  eb.mr.lkey)]
            b.post_recv(eb.qp, RecvWR(i, sg))
            recvs.append((i, w, recv_at, bytes(local[lo:lo + n])))
            recv_at += n if sg else 0
        a.post_send(ea.qp, w.to_send_wr(i, local_addr=ea.buf.addr, lkey=ea.mr.lkey,
                                        remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    sent, got = [], []

    def done():
        sent.extend(a.poll_cq(ea.send_cq, 16))
        got.extend(b.poll_cq(eb.recv_cq, 16))
        return len(sent) == len(wrs) and len(got) == len(recvs)

    fabric.run(until=5.0, stop=done, max_events=200_000)
    note(f"a->b dropped {fabric.injector(A, B).describe()}, "
         f"b->a dropped {fabric.injector(B, A).describe()}")
    assert ea.qp.state == eb.qp.state == QPState.RTS
    assert [(w.wr_id, w.status) for w in sent] == [(i, WCStatus.SUCCESS) for i in range(len(wrs))]
    assert bytes(ea.buf.view[:LOCAL]) == local
    assert bytes(eb.buf.view[:REMOTE]) == remote
    assert [w.wr_id for w in got] == [i for i, *_ in recvs]
    for wc, (i, w, at, payload) in zip(got, recvs):
        assert wc.status == WCStatus.SUCCESS and wc.byte_len == w.length
        assert wc.opcode == (WCOpcode.RECV_RDMA_WITH_IMM if w.opcode == W.RDMA_WRITE_WITH_IMM
                             else WCOpcode.RECV)
        assert bool(wc.wc_flags & WCFlags.WITH_IMM) == (w.opcode != W.SEND)
        if w.opcode != W.SEND:
            assert wc.imm_data == w.imm_data
        if w.opcode != W.RDMA_WRITE_WITH_IMM:
            assert bytes(eb.buf.view[at:at + w.length]) == payload


# -- qp_attrs -----------------------------------------------------------------------------


@FAST
@given(qp_attrs())
def test_qp_attrs_are_valid_and_bring_up_a_pair(attrs):
    assert attrs.path_mtu in (256, 512, 1024, 2048, 4096)
    assert 0 <= attrs.psn_a < 2**24 and 0 <= attrs.psn_b < 2**24
    assert 1 <= attrs.timeout <= 16 and 0 <= attrs.retry_cnt <= 7 and 0 <= attrs.rnr_retry <= 7
    assert 0 <= attrs.min_rnr_timer <= 31 and 1 <= attrs.max_rd_atomic <= 16
    ea, eb = attrs.connect(Device("a", A[0]), Device("b", B[0]),
                           endpoint_args=dict(buf_size=4096))
    for ep, psn in ((ea, attrs.psn_a), (eb, attrs.psn_b)):
        attr, _ = ep.dev.query_qp(ep.qp)
        assert attr.qp_state == QPState.RTS and attr.sq_psn == psn
        assert mtu_bytes(attr.path_mtu) == attrs.path_mtu
        assert (attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic) == \
            (attrs.timeout, attrs.retry_cnt, attrs.rnr_retry, attrs.max_rd_atomic)
        assert ep.qp.selective_repeat == attrs.selective_repeat


def test_qp_attrs_reach_the_psn_wrap_and_both_recoveries():
    seen = set()

    @settings(max_examples=200, database=None)
    @given(qp_attrs())
    def collect(attrs):
        if attrs.psn_a >= 2**24 - 64:
            seen.add("wrap")
        seen.add(attrs.selective_repeat)
        seen.add(attrs.path_mtu)

    collect()
    assert seen == {"wrap", False, True, 256, 512, 1024, 2048, 4096}


def test_qp_attrs_shrink_to_the_rig_defaults():
    assert minimal(qp_attrs()) == QPAttrs()
    assert minimal(qp_attrs(), lambda q: q.psn_b >= 2**24 - 64) == QPAttrs(psn_b=2**24 - 64)
    assert minimal(qp_attrs(), lambda q: q.retry_cnt < 7) == QPAttrs(retry_cnt=6)
    assert minimal(qp_attrs(), lambda q: q.timeout < 10) == QPAttrs(timeout=9)
    assert minimal(qp_attrs(), lambda q: q.selective_repeat) == QPAttrs(selective_repeat=True)
    assert minimal(qp_attrs(), lambda q: q.path_mtu > 1024) == QPAttrs(path_mtu=2048)


def test_qp_attrs_take_values_collections_and_strategies():
    fixed = minimal(qp_attrs(path_mtu=256, psn=st.just(5), timeout=st.integers(3, 3),
                             retry_cnt=[2], selective_repeat=True))
    assert fixed == QPAttrs(path_mtu=256, psn_a=5, psn_b=5, timeout=3, retry_cnt=2,
                            selective_repeat=True)
    with pytest.raises(InvalidArgument):
        qp_attrs(psn_wrap_window=0)
    with pytest.raises(InvalidArgument):
        qp_attrs(timeout=[])


# -- the package ---------------------------------------------------------------------------


def test_package_exports_and_needs_hypothesis_only_for_strategies():
    import softnic.testing as t
    for name in t.__all__:
        assert getattr(t, name) is not None
    code = ("import sys, softnic.testing as t\n"
            "d = t.DropList([1])\n"
            "assert 'hypothesis' not in sys.modules, 'DropList pulled in hypothesis'\n"
            "t.fault_models\n"
            "assert 'hypothesis' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


# -- the ring buffer example ------------------------------------------------------------


@pytest.fixture
def ring(monkeypatch):
    spec = importlib.util.spec_from_file_location("ring_buffer_property", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)    # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_ring_example_without_the_bug_survives_its_worst_drops(ring, monkeypatch):
    monkeypatch.setattr(ring, "BUG", False)
    for ab, ba in [((), ()), ({0, 2}, ()), ({0}, {0}), ({5, 8}, {3}), ({1, 2, 3}, {0, 1, 2})]:
        r = ring.run_ring(0, drops_ab=ab, drops_ba=ba)
        ring.check_run(r)


def test_ring_example_bug_hides_on_a_perfect_link_and_shows_after_a_timeout(ring, monkeypatch):
    monkeypatch.setattr(ring, "BUG", True)
    ring.check_run(ring.run_ring(0))
    ring.check_run(ring.run_ring(0, drops_ab={0}, drops_ba=()))    # NAK repairs it fast
    with pytest.raises(AssertionError, match="overwritten before the consumer read it"):
        ring.check_run(ring.run_ring(0, drops_ab={0, 2}, drops_ba=()))


def _run_example(tmp_path, bug: bool, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RING_BUG="1" if bug else "0")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--hypothesis-seed=0", str(EXAMPLE), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_ring_example_passes_under_pytest(tmp_path):
    r = _run_example(tmp_path, False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout


def test_ring_example_with_the_bug_fails_with_a_minimal_drop_pattern(tmp_path):
    r = _run_example(tmp_path, True, "-k", "exact_drops")
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    # Hypothesis says "Falsifying example" up to 6.16x and "Failing test case" after
    assert "Falsifying example" in out or "Failing test case" in out
    assert "overwritten before the consumer read it" in out
    sets = {}
    for name in ("drops_ab", "drops_ba"):
        m = re.search(name + r"=frozenset\([\[{]?([0-9, ]*)[\]}]?\)", out)
        assert m, out
        sets[name] = {int(x) for x in m.group(1).replace(" ", "").split(",") if x}
    assert 1 <= len(sets["drops_ab"]) + len(sets["drops_ba"]) <= 2, sets
    assert 0 in sets["drops_ab"]      # the first record's WRITE, and then its repair
    assert re.search(r"seed=0\b", out)
    assert "replay: run_ring(0, drops_ab=" in out
    assert "dropped a->b #0 at 10.000 us: RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE" in out
