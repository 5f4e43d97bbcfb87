"""Selective repeat places the packets of later WRITEs beyond a hole at once, even
where they overlap bytes an earlier WRITE still has to deliver; the earlier
bytes, when they come, skip what newer PSNs already wrote.  The memory ends as
in-order application leaves it, and everything that is not a WRITE still
executes in order."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, note, settings, strategies as st

from softnic.core import responder
from softnic.core.device import DeviceConfig
from softnic.core.enums import WCOpcode, WCStatus as S, WROpcode as W
from softnic.core.qp import RecvWR
from softnic.driver.faults import COUNTER_NAMES
from softnic.testing import loss_patterns
from softnic.wire.psn import psn_add, psn_distance
from softnic.wire.roce import AethCode, Kind, NakCode, Opcode as O, decode

from enginekit import fill, pair, pattern, read, send_wr, write_wr

MTU = 256
REGION = 4096          # every WRITE lands in [0, REGION) of b's buffer: they overlap
RECV_AT = 1 << 14      # receive buffers on b, clear of the WRITEs
SR = DeviceConfig(min_timer=1e-3, selective_repeat=True)


class DropDelay:
    """A link injector: drops the datagrams whose send index is in ``drops`` and
    holds back those in ``late`` by ``delay`` seconds (they arrive reordered)."""

    def __init__(self, drops, late, delay=25e-6):
        self.drops, self.late, self.delay = frozenset(drops), frozenset(late), delay
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)

    def apply(self, data, now):
        i = self.counters["sent"]
        self.counters["sent"] = i + 1
        if i in self.drops:
            self.counters["dropped_loss"] += 1
            return []
        self.counters["delivered"] += 1
        return [(now + self.delay if i in self.late else now, data)]


def _placed_spy(monkeypatch, p_box):
    """Offsets (from the first PSN) of the packets the device placed beyond a hole."""
    placed = []
    real = responder.hold

    def hold(dev, qp, psn, ackreq, item):
        if type(item) is responder.PlacedWrite:
            placed.append(psn_distance(psn, p_box[0].ea.qp.attr.sq_psn))
        return real(dev, qp, psn, ackreq, item)
    monkeypatch.setattr(responder, "hold", hold)
    return placed


# ------------------------------------------------------------------ property

@st.composite
def workloads(draw):
    ops = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["WRITE", "WRITE", "WRITE", "WRITE_IMM", "SEND"]))
        n = draw(st.one_of(st.integers(0, 300), st.integers(256, 3072)))
        roff = draw(st.integers(0, REGION - n))
        if draw(st.booleans()):       # now and then exactly on an earlier WRITE's bytes
            prev = [o for o in ops if o[0] != "SEND" and o[1] <= REGION]
            if prev:
                pk, pn, pr = draw(st.sampled_from(prev))
                n, roff = pn, pr
        ops.append((kind, n, roff))
    return dict(seed=draw(st.integers(0, 2**32 - 1)), ops=ops,
                psn=draw(st.one_of(st.just(0), st.integers(0xFFFF00, 0xFFFFFF))),
                drops=draw(loss_patterns(60, max_drops=8)),
                late=draw(loss_patterns(60, max_drops=6)),
                ack_drops=draw(loss_patterns(30, max_drops=3)))


def run_workload(w):
    """Post ``w['ops']`` from a to b over a link that drops and reorders what
    ``w`` names; returns the pair, the expected memory of b's WRITE region and
    the expected receive completions."""
    p = pair(seed=w["seed"] & 0xFFFF, mtu=MTU, config=SR, psn_a=w["psn"], psn_b=w["psn"],
             endpoint_args=dict(buf_size=1 << 16))
    p.fabric.set_injector(p.a.address, p.b.address, DropDelay(w["drops"], w["late"]))
    p.fabric.set_injector(p.b.address, p.a.address, DropDelay(w["ack_drops"], ()))
    rng = random.Random(w["seed"])
    init = rng.randbytes(REGION)
    fill(p.eb, 0, init)
    ref = bytearray(init)
    src = 0
    recvs = []
    for i, (kind, n, roff) in enumerate(w["ops"]):
        data = rng.randbytes(n)
        fill(p.ea, src, data)
        if kind == "SEND":
            r = RECV_AT + 4096 * len(recvs)
            p.b.post_recv(p.eb.qp, RecvWR(100 + i, [p.eb.sge(r, 4096)]))
            recvs.append((100 + i, WCOpcode.RECV, n, 0, r, data))
            p.a.post_send(p.ea.qp, send_wr(i, p.ea, src, n))
        else:
            imm = 0
            opcode = W.RDMA_WRITE
            if kind == "WRITE_IMM":
                imm = rng.getrandbits(32)
                opcode = W.RDMA_WRITE_WITH_IMM
                p.b.post_recv(p.eb.qp, RecvWR(100 + i, []))
                recvs.append((100 + i, WCOpcode.RECV_RDMA_WITH_IMM, n, imm, None, None))
            p.a.post_send(p.ea.qp, write_wr(i, p.ea, p.eb, src, n, roff, opcode=opcode,
                                            imm_data=imm))
            ref[roff:roff + n] = data
        src += n
    return p, bytes(ref), recvs


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_overlapping_writes_under_loss_equal_in_order_application(w):
    note(f"replay with: run_workload({w!r})")
    p, ref, recvs = run_workload(w)
    nops = len(w["ops"])
    p.run_until(lambda: len(p.send_wcs()) == nops, limit=5)
    p.run_until(lambda: len(p.recv_wcs()) == len(recvs), limit=1)
    note(f"a: {dict((k, v) for k, v in p.a.counters.items() if v)}")
    note(f"b: {dict((k, v) for k, v in p.b.counters.items() if v)}")
    assert [(c.wr_id, c.status) for c in p.send_wcs()] == [(i, S.SUCCESS) for i in range(nops)]
    got = [(c.wr_id, c.status, c.opcode, c.byte_len, c.imm_data) for c in p.recv_wcs()]
    assert got == [(r[0], S.SUCCESS, r[1], r[2], r[3]) for r in recvs]
    assert read(p.eb, 0, REGION) == ref
    for _, _, n, _, at, data in recvs:
        if at is not None:
            assert read(p.eb, at, n) == data


# ------------------------------------------------------------------ targeted

N = 20000                          # 79 packets of MTU 256


def _drop_requests(first: int, left: dict):
    """A ``Filter`` drop rule: lose request packet ``k`` (PSN ``first + k``)
    ``left[k]`` times."""
    def drop(pkt, raw):
        k = psn_distance(pkt.bth.psn, first)
        if pkt.info.is_request and left.get(k, 0) > 0:
            left[k] -= 1
            return True
        return False
    return drop


def _two_writes(monkeypatch, drops, second_off, *, n2=N, first_n=N):
    box = []
    placed = _placed_spy(monkeypatch, box)
    p = pair(seed=1, mtu=MTU, config=SR, endpoint_args=dict(buf_size=1 << 17))
    box.append(p)
    first = p.ea.qp.req.psn
    left = dict(drops)

    p.filter_a.drop = _drop_requests(first, left)
    a, b = pattern(first_n, 1), pattern(n2, 2)
    fill(p.ea, 0, a)
    fill(p.ea, 1 << 16, b)
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, first_n, 0))
    p.a.post_send(p.ea.qp, write_wr(2, p.ea, p.eb, 1 << 16, n2, second_off))
    p.run_until(lambda: len(p.send_wcs()) == 2, limit=5)
    assert [(c.wr_id, c.status) for c in p.send_wcs()] == [(1, S.SUCCESS), (2, S.SUCCESS)]
    return p, placed, a, b


@pytest.mark.parametrize("second_off", [0, 10000, 65536])
def test_hole_resend_does_not_overwrite_a_later_write(monkeypatch, second_off):
    """The first WRITE loses its packet 10; the second WRITE's packets land before
    the resend.  Overlapping or not, the second WRITE's packets are placed at
    once, and the resend skips the bytes they wrote."""
    p, placed, a, b = _two_writes(monkeypatch, {10: 1}, second_off)
    ref = bytearray(1 << 17)
    ref[0:N] = a
    ref[second_off:second_off + N] = b
    assert read(p.eb, 0, 1 << 17) == bytes(ref)
    assert [k for k in placed if 79 < k < 158]       # the second WRITE's packets, early
    assert [k for k in placed if 10 < k < 79]        # the first WRITE's own


def test_same_bytes_lost_in_both_writes(monkeypatch):
    """Both WRITEs on the same bytes lose a packet; the older one's resend comes
    first, then the newer one's: the newer bytes win everywhere."""
    p, placed, a, b = _two_writes(monkeypatch, {10: 1, 79 + 10: 1, 79 + 30: 2}, 0)
    assert read(p.eb, 0, N) == b
    assert [k for k in placed if 79 + 30 < k < 158]


def test_older_resend_lost_again_after_newer_placed(monkeypatch):
    """The hole's resend is lost too, so the newer WRITE is wholly placed before
    the older bytes arrive at last."""
    p, placed, a, b = _two_writes(monkeypatch, {5: 3}, 0)
    assert read(p.eb, 0, N) == b
    assert p.b.counters["out_of_seq_request"] >= 79


def test_partial_overlap_keeps_both_edges(monkeypatch):
    """A shorter later WRITE in the middle of an earlier one: the earlier bytes
    around it stay, the later bytes win inside it."""
    p, placed, a, b = _two_writes(monkeypatch, {40: 1}, 3000, n2=5000)
    want = bytearray(a)
    want[3000:8000] = b
    assert read(p.eb, 0, N) == bytes(want)


def test_first_beyond_hole_with_bad_rkey_naks_and_leaves_memory(monkeypatch):
    """The second WRITE's FIRST arrives beyond a hole with a bad rkey: it is not
    used to place anything; once the hole fills the general path NAKs it
    (REM_ACCESS_ERR), and neither its target nor the third WRITE's is touched."""
    box = []
    placed = _placed_spy(monkeypatch, box)
    p = pair(seed=1, mtu=MTU, config=SR, endpoint_args=dict(buf_size=1 << 17))
    box.append(p)
    first = p.ea.qp.req.psn
    dropped = []

    def drop(pkt, raw):
        if pkt.info.is_request and psn_distance(pkt.bth.psn, first) == 10 and not dropped:
            dropped.append(pkt)
            return True
        return False
    p.filter_a.drop = drop
    fill(p.ea, 0, pattern(N, 1))
    before = read(p.eb, 0, 1 << 17)
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, N, 65536))
    p.a.post_send(p.ea.qp, write_wr(2, p.ea, p.eb, 0, N, 0, rkey=p.eb.mr.rkey ^ 0x5A5A00))
    p.a.post_send(p.ea.qp, write_wr(3, p.ea, p.eb, 0, N, 0))
    p.run_until(lambda: len(p.send_wcs()) == 3, limit=5)
    assert [(c.wr_id, c.status) for c in p.send_wcs()] == \
        [(1, S.SUCCESS), (2, S.REM_ACCESS_ERR), (3, S.WR_FLUSH_ERR)]
    assert p.b.counters["resp_nak_remote_access_error"] == 1
    after = read(p.eb, 0, 1 << 17)
    assert after[:65536] == before[:65536]                 # WRITEs 2 and 3 left nothing
    assert after[65536:65536 + N] == pattern(N, 1)
    assert not [k for k in placed if k >= 79]


@pytest.mark.parametrize("fast", [True, False])
def test_first_placed_beyond_a_hole_is_checked_again_in_order(fast):
    """The second WRITE's FIRST arrives beyond a hole with a good rkey, and its
    region is deregistered before the hole fills: in PSN order the WRITE finds no
    target, so it fails (REM_ACCESS_ERR) and the QP stops, whether its FIRST was
    held decoded (the general path) or placed on arrival (the common case)."""
    cfg = DeviceConfig(min_timer=1e-3, selective_repeat=True, fast_path=fast)
    p = pair(seed=1, mtu=MTU, config=cfg, endpoint_args=dict(buf_size=1 << 17))
    first = p.ea.qp.req.psn
    held = []
    p.filter_a.drop = _drop_requests(first, {10: 1})
    second = p.b.reg_mr(p.eb.pd, p.eb.buf.addr + 65536, N, p.eb.mr.access)
    fill(p.ea, 0, pattern(N, 1))
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, N, 0))
    wr = write_wr(2, p.ea, p.eb, 0, N, 65536, rkey=second.rkey)
    p.a.post_send(p.ea.qp, wr)
    p.a.post_send(p.ea.qp, write_wr(3, p.ea, p.eb, 0, N, 0))

    def second_first_held():
        item = p.eb.qp.sr.ooo.get(psn_add(first, 79))
        held[:] = [item]
        return item is not None
    p.run_until(second_first_held, limit=5)
    # placed on arrival only by the common case
    assert (type(held[0]) is responder.PlacedWrite) == fast
    p.b.dereg_mr(second)
    p.run_until(lambda: len(p.send_wcs()) == 3, limit=5)
    assert [(c.wr_id, c.status) for c in p.send_wcs()] == \
        [(1, S.SUCCESS), (2, S.REM_ACCESS_ERR), (3, S.WR_FLUSH_ERR)]
    assert p.b.counters["resp_nak_remote_access_error"] == 1
    assert read(p.eb, 0, N) == pattern(N, 1)


def test_write_after_a_held_send_waits(monkeypatch):
    """A WRITE behind a SEND still to execute is not placed early: its bytes could
    be the receive buffer's (later bytes win as in order)."""
    box = []
    placed = _placed_spy(monkeypatch, box)
    p = pair(seed=1, mtu=MTU, config=SR, endpoint_args=dict(buf_size=1 << 17))
    box.append(p)
    first = p.ea.qp.req.psn
    left = {10: 1}

    p.filter_a.drop = _drop_requests(first, left)
    a, s, b = pattern(N, 1), pattern(2000, 3), pattern(N, 2)
    fill(p.ea, 0, a)
    fill(p.ea, 30000, s)
    fill(p.ea, 1 << 16, b)
    p.b.post_recv(p.eb.qp, RecvWR(7, [p.eb.sge(1000, 4000)]))   # the SEND lands on b[1000:3000]
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, N, 0))
    p.a.post_send(p.ea.qp, send_wr(2, p.ea, 30000, 2000))
    p.a.post_send(p.ea.qp, write_wr(3, p.ea, p.eb, 1 << 16, N, 0))
    p.run_until(lambda: len(p.send_wcs()) == 3, limit=5)
    assert [(c.wr_id, c.status) for c in p.send_wcs()] == [(i, S.SUCCESS) for i in (1, 2, 3)]
    assert read(p.eb, 0, N) == b
    assert not [k for k in placed if k >= 79]


def test_go_back_n_unchanged():
    """Go-back-N holds nothing: out-of-sequence packets are dropped with one NAK
    and the sender goes back."""
    p = pair(seed=1, mtu=MTU, trace=True, endpoint_args=dict(buf_size=1 << 17))
    first = p.ea.qp.req.psn
    left = {10: 1}

    p.filter_a.drop = _drop_requests(first, left)
    a, b = pattern(N, 1), pattern(N, 2)
    fill(p.ea, 0, a)
    fill(p.ea, 1 << 16, b)
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, N, 0))
    p.a.post_send(p.ea.qp, write_wr(2, p.ea, p.eb, 1 << 16, N, 0))
    p.run_until(lambda: len(p.send_wcs()) == 2, limit=5)
    assert [(c.wr_id, c.status) for c in p.send_wcs()] == [(1, S.SUCCESS), (2, S.SUCCESS)]
    assert read(p.eb, 0, N) == b
    assert not p.eb.qp.sr.ooo
    naks = [pk for _, pk in p.packets(src=p.b) if pk.info.kind == Kind.ACK
            and pk.aeth.code == AethCode.NAK]
    assert len(naks) == 1 and naks[0].aeth.value == NakCode.PSN_SEQUENCE_ERROR
    assert psn_distance(naks[0].bth.psn, first) == 10


@pytest.mark.parametrize("sr", [False, True])
def test_duplicate_of_an_old_packet_only_acks(sr):
    """A MIDDLE of a finished WRITE arriving again after a later WRITE rewrote its
    bytes is a duplicate: it is acknowledged and counted, never placed."""
    p = pair(seed=1, mtu=MTU, config=SR if sr else None, trace=True,
             endpoint_args=dict(buf_size=1 << 17))
    a, b = pattern(N, 1), pattern(N, 2)
    fill(p.ea, 0, a)
    fill(p.ea, 1 << 16, b)
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, N, 0))
    p.a.post_send(p.ea.qp, write_wr(2, p.ea, p.eb, 1 << 16, N, 0))
    p.run_until(lambda: len(p.send_wcs()) == 2, limit=5)
    first = p.ea.qp.attr.sq_psn
    old = [rec for rec in p.fabric.trace if rec.kind == "send" and rec.src == p.a.address
           and decode(memoryview(rec.data)[:-4]).bth.opcode == O.RC_RDMA_WRITE_MIDDLE
           and decode(memoryview(rec.data)[:-4]).bth.psn == psn_add(first, 5)]
    assert old
    dup = p.b.counters["duplicate_request"]
    p.b.receive_datagram(bytes(old[0].data), p.a.address, p.fabric.now)
    assert p.b.counters["duplicate_request"] == dup + 1
    out = p.b.datagrams_to_send(p.fabric.now)
    ack = decode(memoryview(out[0][0])[:-4]) if len(out) == 1 else None
    assert ack is not None and ack.bth.opcode == O.RC_ACKNOWLEDGE          # one ACK
    assert psn_distance(ack.bth.psn, first) == 2 * 79 - 1
    assert read(p.eb, 0, N) == b
    bad = bytearray(old[0].data)
    bad[40] ^= 1                                            # a corrupted copy: dropped
    p.b.receive_datagram(bytes(bad), p.a.address, p.fabric.now)
    assert p.b.counters["duplicate_request"] == dup + 1
    assert p.b.counters["rcvd_icrc_err"] == 1
    assert p.b.datagrams_to_send(p.fabric.now) == []


def test_selective_acks_for_one_hole_coalesce():
    """Packets held beyond one hole, received in one batch, leave one NAK naming
    the hole, carrying the newest held PSN the requester asked about (not one NAK
    per ACK request); a second hole still gets its own NAK."""
    p = pair(seed=1, mtu=MTU, config=SR, endpoint_args=dict(buf_size=1 << 17))
    first = p.ea.qp.req.psn
    caught = []

    def catch(pkt, raw):
        if pkt.info.is_request:
            caught.append((pkt, bytes(raw)))
            return True
        return False
    p.filter_a.drop = catch
    fill(p.ea, 0, pattern(N, 1))
    p.a.post_send(p.ea.qp, write_wr(1, p.ea, p.eb, 0, N, 0))
    p.run_until(lambda: len(caught) >= 60, limit=1)
    rel = {psn_distance(pk.bth.psn, first): (pk, raw) for pk, raw in caught}
    now = p.fabric.now
    for k in sorted(rel):
        if k not in (10, 40):
            p.b.receive_datagram(rel[k][1], p.a.address, now)
    out = p.b.datagrams_to_send(now)
    from softnic.wire.roce import decode
    acks = [decode(d[:-4]) for d, _ in out]
    naks = [(psn_distance(a.bth.psn, first), psn_distance(a.aeth.msn, first)) for a in acks
            if a.aeth.code == AethCode.NAK]
    asked = [k for k in sorted(rel) if k > 10 and k not in (40,) and rel[k][0].bth.ackreq]
    assert asked                                   # the requester asked for ACKs beyond the hole
    assert [n for n, _ in naks] == [10, 40]
    assert naks[0][1] == max(asked)                # the newest selective ACK
    assert p.b.counters["sack_coalesced"] >= len(asked) - 1
