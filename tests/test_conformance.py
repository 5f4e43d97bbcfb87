"""Conformance: a live softnic device against a RoCEv2 peer softnic did not write.

The peer (``roce_peer``) is scapy's BTH, AETH and ICRC with the other extended
headers packed by hand, on a plain UDP socket; the device is a live one (real UDP,
its progress thread) driven through the pyverbs API.  Each case plays one of the
requester's or the responder's error rules (IBA chapter 9; the list follows
datenlord/roce-sim's cases, which Linux rxe passes) and asserts what the peer sees
on the wire (opcodes, PSNs, AETH syndromes and MSNs, every ICRC checked by scapy)
and what softnic reports (the completion's status, opcode and byte_len, the QP's state).

Timers: the QP's ``timeout`` is 1 (8.192 us, raised to the 1 ms timer floor) where
the peer stays silent, 18 (1.07 s) where the peer must answer before the
retransmission timer fires, so that a loaded host does not reorder the exchange,
and 24 (69 s) where no timeout may take part at all.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys

import pytest

import softnic.driver.config as _config
import softnic.driver.nic as _nic
import verbs_api.enums as e
from verbs_api.addr import AHAttr, GID, GlobalRoute
from verbs_api.mr import MR
from verbs_api.qp import QPAttr
from verbs_api.wr import SGE, RecvWR, SendWR

from roce_peer import (
    ACK, ATOMIC_ACK, CMP_SWAP, FETCH_ADD, NAK_INV_REQ, NAK_PSN_SEQ, NAK_REM_ACCESS, NAK_REM_OP,
    READ_FIRST, READ_LAST, READ_MIDDLE, READ_ONLY, READ_REQUEST, SEND_ONLY, SYN_ACK, SYN_RNR,
    WRITE_FIRST, WRITE_LAST, WRITE_MIDDLE, WRITE_ONLY, Peer)
from verbskit import ALL_ACCESS, Side, poll

MTU = 256                   # IBV_MTU_256: a 1024-byte message is 4 packets
SILENT = 1                  # timeout attribute: the timer floor (1 ms)
PATIENT = 18                # timeout attribute: 1.07 s, time for the peer to answer
NEVER = 24                  # timeout attribute: 69 s, where no timeout may take part
DEV = 'conf0'
RVA, RKEY = 0x7F0000001000, 0x1234      # what softnic's requests name at the peer


class Rig:
    """One softnic device (``conf0``) with a Side on it, and the peer, on
    127.X.36.2 and 127.X.36.3 (X drawn per test: no other test uses .36)."""

    def __init__(self, access=ALL_ACCESS):
        rng = random.Random()
        for _ in range(20):
            net = f'127.{rng.randrange(20, 250)}.36'
            try:
                self.peer = Peer(f'{net}.3')
            except OSError:
                continue
            break
        else:
            raise RuntimeError('no free loopback address for the peer')
        _nic.configure(_config.RuntimeConfig(
            devices=(_config.DeviceSpec(DEV, f'{net}.2'),), min_timer=1e-3))
        self.side = Side(DEV, access=access, msg_size=1 << 16)
        self.nic = self.side.ctx._nic

    def connect(self, *, timeout=NEVER, retry_cnt=3, rnr_retry=3, min_rnr_timer=1):
        """The QP to RTS aimed at the peer (PSNs from 0), the peer at the QP."""
        attr = QPAttr(port_num=1, path_mtu=e.IBV_MTU_256)
        attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | \
            e.IBV_ACCESS_REMOTE_ATOMIC
        attr.dest_qp_num = self.peer.qpn
        attr.rq_psn = attr.sq_psn = 0
        attr.ah_attr = AHAttr(port_num=1, is_global=1,
                              gr=GlobalRoute(dgid=GID(self.peer.gid), sgid_index=0))
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 4
        attr.min_rnr_timer = min_rnr_timer
        attr.timeout = timeout
        attr.retry_cnt = retry_cnt
        attr.rnr_retry = rnr_retry
        self.side.qp.to_rts(attr)
        self.peer.connect(self.nic.ip, self.nic.port, self.side.qp.qp_num)
        return self

    @property
    def qp_state(self):
        return self.side.qp.query(e.IBV_QP_STATE)[0].qp_state

    def counter(self, name: str) -> int:
        with self.nic.lock:
            return self.nic.counters.get(name, 0)

    def wr(self, wr_id, opcode, offset, length, mr=None, **kw):
        """A signaled send WR over ``length`` bytes of the side's MR at ``offset``."""
        mr = mr or self.side.mr
        wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1,
                    sg=[SGE(mr.buf + offset, length, mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        if opcode in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_READ):
            wr.set_wr_rdma(RKEY, kw.get('va', RVA))
        if opcode in (e.IBV_WR_ATOMIC_FETCH_AND_ADD, e.IBV_WR_ATOMIC_CMP_AND_SWP):
            wr.set_wr_atomic(RKEY, kw.get('va', RVA), kw.get('add', 0), kw.get('swap', 0))
        return wr

    def post(self, *wrs):
        """Post ``wrs`` as one chain (one call: they start together)."""
        for a, b in zip(wrs, wrs[1:]):
            a.next_wr = b
        self.side.qp.post_send(wrs[0])

    def close(self):
        self.peer.close()
        self.side.close()
        _nic.configure(None)


@pytest.fixture
def rig():
    r = Rig()
    yield r
    assert r.peer.icrc_errors == 0, 'softnic sent a packet whose ICRC scapy rejects'
    r.close()


def wire(seen):
    return [(p.opcode, p.psn) for p in seen]


def wcs(cq, n):
    return [(w.wr_id, w.status) for w in poll(cq, n)]


# ====================================================================== softnic as requester


@pytest.mark.parametrize('retry_cnt', [0, 3, 7])
def test_no_answer_retry_cnt_n_gives_n_retries_then_retry_exc_err(rig, retry_cnt):
    """After ``retry_cnt`` retries the WQE completes with RETRY_EXC_ERR and the QP
    goes to ERR, its later WRs flushed; 7 is a count like the others (the IBA and
    mlx5; ibv_modify_qp(3) gives the infinite 7 to rnr_retry only)."""
    rig.connect(timeout=SILENT, retry_cnt=retry_cnt)
    rig.post(rig.wr(1, e.IBV_WR_RDMA_WRITE, 0, 64), rig.wr(2, e.IBV_WR_RDMA_WRITE, 64, 64))
    seen = rig.peer.expect(2 * (retry_cnt + 1), timeout=10)
    assert wire(seen) == [(WRITE_ONLY, 0), (WRITE_ONLY, 1)] * (retry_cnt + 1)
    assert all(p.reth == (RVA, RKEY, 64) for p in seen)
    assert wcs(rig.side.cq, 2) == [(1, e.IBV_WC_RETRY_EXC_ERR), (2, e.IBV_WC_WR_FLUSH_ERR)]
    assert rig.qp_state == e.IBV_QPS_ERR
    assert rig.peer.quiet(0.1) == []
    assert rig.counter('retry_exceeded_err') == 1


@pytest.mark.parametrize('rnr_retry', [0, 2])
def test_rnr_naks_exhaust_rnr_retry(rig, rnr_retry):
    """Each RNR NAK is retried after its timer, ``rnr_retry`` times, then
    RNR_RETRY_EXC_ERR and the QP in ERR."""
    rig.connect(rnr_retry=rnr_retry)
    rig.side.mr.write(b'r' * 40, 40, 0)
    rig.post(rig.wr(5, e.IBV_WR_SEND, 0, 40))
    for _ in range(rnr_retry + 1):
        (p,) = rig.peer.expect(1)
        assert (p.opcode, p.psn, p.payload) == (SEND_ONLY, 0, b'r' * 40)
        rig.peer.ack(0, SYN_RNR | 1)             # RNR timer code 1: 0.01 ms
    assert wcs(rig.side.cq, 1) == [(5, e.IBV_WC_RNR_RETRY_EXC_ERR)]
    assert rig.qp_state == e.IBV_QPS_ERR
    assert rig.peer.quiet(0.1) == []
    assert rig.counter('rcvd_rnr_err') == rnr_retry + 1


def test_rnr_nak_then_ack_completes(rig):
    rig.connect(rnr_retry=2)
    rig.post(rig.wr(5, e.IBV_WR_SEND, 0, 40))
    for _ in range(2):
        assert wire(rig.peer.expect(1)) == [(SEND_ONLY, 0)]
        rig.peer.ack(0, SYN_RNR | 1)
    assert wire(rig.peer.expect(1)) == [(SEND_ONLY, 0)]
    rig.peer.ack(0, SYN_ACK, msn=1)
    (wc,) = poll(rig.side.cq)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (5, e.IBV_WC_SUCCESS,
                                                            e.IBV_WC_SEND, 40)
    assert rig.qp_state == e.IBV_QPS_RTS


def test_ghost_acks_are_ignored(rig):
    """An ACK for a PSN never sent (beyond the next PSN, or before the oldest
    outstanding one) acknowledges nothing: the WRITE is sent again at the timeout
    and completes only when its own PSN is acknowledged."""
    rig.connect(timeout=PATIENT, retry_cnt=3)
    rig.post(rig.wr(1, e.IBV_WR_RDMA_WRITE, 0, 64))
    assert wire(rig.peer.expect(1)) == [(WRITE_ONLY, 0)]
    rig.peer.ack(5, msn=1)
    rig.peer.ack(0xFFFFF0, msn=1)
    assert wire(rig.peer.expect(1)) == [(WRITE_ONLY, 0)]     # the timeout's resend
    assert rig.side.cq.poll()[0] == 0
    rig.peer.ack(0, msn=1)
    (wc,) = poll(rig.side.cq)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (1, e.IBV_WC_SUCCESS,
                                                            e.IBV_WC_RDMA_WRITE, 64)
    assert rig.counter('rcvd_stale_response') == 2


def test_partial_ack_then_timeout_resends_from_the_first_unacknowledged(rig):
    rig.connect(timeout=PATIENT, retry_cnt=3)
    data = bytes(range(256)) * 4
    rig.side.mr.write(data, 1024, 0)
    rig.post(rig.wr(1, e.IBV_WR_RDMA_WRITE, 0, 1024))
    seen = rig.peer.expect(4)
    assert wire(seen) == [(WRITE_FIRST, 0), (WRITE_MIDDLE, 1), (WRITE_MIDDLE, 2),
                          (WRITE_LAST, 3)]
    assert seen[0].reth == (RVA, RKEY, 1024)
    assert b''.join(p.payload for p in seen) == data
    rig.peer.ack(1)
    again = rig.peer.expect(2)
    assert wire(again) == [(WRITE_MIDDLE, 2), (WRITE_LAST, 3)]
    assert [p.payload for p in again] == [data[512:768], data[768:]]
    rig.peer.ack(3, msn=1)
    (wc,) = poll(rig.side.cq)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (1, e.IBV_WC_SUCCESS,
                                                            e.IBV_WC_RDMA_WRITE, 1024)


def test_sequence_nak_resends_from_its_psn_and_acknowledges_what_precedes_it(rig):
    """A PSN SEQUENCE ERROR NAK naming PSN 2: PSNs 2 and 3 are sent again, and,
    the NAK having acknowledged PSNs 0 and 1 (a NAK acknowledges every PSN
    before its own), the next timeout resends from 2 as well."""
    rig.connect(timeout=PATIENT, retry_cnt=3)
    rig.post(rig.wr(1, e.IBV_WR_RDMA_WRITE, 0, 1024))
    assert [p.psn for p in rig.peer.expect(4)] == [0, 1, 2, 3]
    rig.peer.ack(2, NAK_PSN_SEQ, msn=0)
    assert wire(rig.peer.expect(2)) == [(WRITE_MIDDLE, 2), (WRITE_LAST, 3)]
    assert wire(rig.peer.expect(2)) == [(WRITE_MIDDLE, 2), (WRITE_LAST, 3)]   # timeout
    rig.peer.ack(3, msn=1)
    assert wcs(rig.side.cq, 1) == [(1, e.IBV_WC_SUCCESS)]
    assert rig.counter('rcvd_seq_err') == 1


@pytest.mark.parametrize('retry_cnt', [0, 2])
def test_sequence_naks_that_acknowledge_nothing_count_against_retry_cnt(rig, retry_cnt):
    """A responder that NAKs PSN 0 (PSN SEQUENCE ERROR) on every resend: each
    resend is a retry, as a timeout's is, so after ``retry_cnt`` of them the WQE
    fails with RETRY_EXC_ERR (as roce-sim's PSN-retry-limit case) instead of the
    two ends trading NAKs and resends for ever."""
    rig.connect(retry_cnt=retry_cnt)
    rig.post(rig.wr(1, e.IBV_WR_RDMA_WRITE, 0, 64), rig.wr(2, e.IBV_WR_RDMA_WRITE, 64, 64))
    for _ in range(retry_cnt + 1):
        assert wire(rig.peer.expect(2)) == [(WRITE_ONLY, 0), (WRITE_ONLY, 1)]
        rig.peer.ack(0, NAK_PSN_SEQ, msn=0)
    assert wcs(rig.side.cq, 2) == [(1, e.IBV_WC_RETRY_EXC_ERR), (2, e.IBV_WC_WR_FLUSH_ERR)]
    assert rig.qp_state == e.IBV_QPS_ERR
    assert rig.peer.quiet(0.1) == []
    assert rig.counter('rcvd_seq_err') == retry_cnt + 1


def test_read_response_of_a_later_read_acknowledges_the_write_before_it(rig):
    """A READ response for PSN p acknowledges every request before p: the WRITE
    at PSN 0, never ACKed, completes with the READ."""
    rig.connect()
    rig.post(rig.wr(1, e.IBV_WR_RDMA_WRITE, 0, 64), rig.wr(2, e.IBV_WR_RDMA_READ, 4096, 64))
    seen = rig.peer.expect(2)
    assert wire(seen) == [(WRITE_ONLY, 0), (READ_REQUEST, 1)]
    assert seen[1].reth == (RVA, RKEY, 64)
    data = bytes(range(64))
    rig.peer.send(READ_ONLY, 1, syndrome=SYN_ACK, msn=2, payload=data)
    got = poll(rig.side.cq, 2)
    assert [(w.wr_id, w.status, w.opcode, w.byte_len) for w in got] == [
        (1, e.IBV_WC_SUCCESS, e.IBV_WC_RDMA_WRITE, 64),
        (2, e.IBV_WC_SUCCESS, e.IBV_WC_RDMA_READ, 64)]
    assert rig.side.mr.read(64, 4096) == data


def test_read_response_beyond_the_expected_psn_re_requests_the_missing_read(rig):
    """Two READs at PSNs 0 and 1; the response for 1 comes first: the response
    for 0 was lost (implied NAK), so the requester re-issues from PSN 0 and
    completes nothing until the responses come in order."""
    rig.connect()
    rig.post(rig.wr(1, e.IBV_WR_RDMA_READ, 0, 64, va=RVA),
             rig.wr(2, e.IBV_WR_RDMA_READ, 64, 64, va=RVA + 64))
    assert wire(rig.peer.expect(2)) == [(READ_REQUEST, 0), (READ_REQUEST, 1)]
    a, b = b'A' * 64, b'B' * 64
    rig.peer.send(READ_ONLY, 1, syndrome=SYN_ACK, msn=2, payload=b)
    again = rig.peer.expect(2)
    assert wire(again) == [(READ_REQUEST, 0), (READ_REQUEST, 1)]
    assert [p.reth for p in again] == [(RVA, RKEY, 64), (RVA + 64, RKEY, 64)]
    assert rig.side.cq.poll()[0] == 0
    rig.peer.send(READ_ONLY, 0, syndrome=SYN_ACK, msn=1, payload=a)
    rig.peer.send(READ_ONLY, 1, syndrome=SYN_ACK, msn=2, payload=b)
    assert wcs(rig.side.cq, 2) == [(1, e.IBV_WC_SUCCESS), (2, e.IBV_WC_SUCCESS)]
    assert rig.side.mr.read(128, 0) == a + b


def test_ack_beyond_an_atomic_re_requests_the_atomic(rig):
    """An ACK for the WRITE after an ATOMIC whose acknowledgement never came: the
    ATOMIC's response was lost (implied NAK), so it is requested again (the
    responder answers a duplicate from its saved result) and both complete."""
    rig.connect()
    rig.post(rig.wr(1, e.IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8, add=3),
             rig.wr(2, e.IBV_WR_RDMA_WRITE, 64, 64))
    seen = rig.peer.expect(2)
    assert wire(seen) == [(FETCH_ADD, 0), (WRITE_ONLY, 1)]
    assert seen[0].atomic == (RVA, RKEY, 3, 0)
    rig.peer.ack(1, msn=2)
    again = rig.peer.expect(2)
    assert wire(again) == [(FETCH_ADD, 0), (WRITE_ONLY, 1)]
    assert again[0].atomic == (RVA, RKEY, 3, 0)
    assert rig.side.cq.poll()[0] == 0
    rig.peer.send(ATOMIC_ACK, 0, syndrome=SYN_ACK, msn=1, orig=41)
    rig.peer.ack(1, msn=2)
    got = poll(rig.side.cq, 2)
    assert [(w.wr_id, w.status, w.opcode, w.byte_len) for w in got] == [
        (1, e.IBV_WC_SUCCESS, e.IBV_WC_FETCH_ADD, 8),
        (2, e.IBV_WC_SUCCESS, e.IBV_WC_RDMA_WRITE, 64)]
    assert rig.side.mr.read(8, 0) == _u64(41)


def test_read_response_gap_re_requests_from_the_missing_response(rig):
    """A 4-response READ whose second response is lost: the requester re-issues
    the READ from PSN 1 for the 768 bytes not yet received."""
    rig.connect()
    rig.post(rig.wr(1, e.IBV_WR_RDMA_READ, 0, 1024))
    assert wire(rig.peer.expect(1)) == [(READ_REQUEST, 0)]
    data = bytes(random.Random(1).randbytes(1024))
    rig.peer.send(READ_FIRST, 0, syndrome=SYN_ACK, msn=1, payload=data[:256])
    rig.peer.send(READ_MIDDLE, 2, payload=data[512:768])
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.reth) == (READ_REQUEST, 1, (RVA + 256, RKEY, 768))
    rig.peer.send(READ_FIRST, 1, syndrome=SYN_ACK, msn=1, payload=data[256:512])
    rig.peer.send(READ_MIDDLE, 2, payload=data[512:768])
    rig.peer.send(READ_LAST, 3, syndrome=SYN_ACK, msn=1, payload=data[768:])
    (wc,) = poll(rig.side.cq)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (1, e.IBV_WC_SUCCESS,
                                                            e.IBV_WC_RDMA_READ, 1024)
    assert rig.side.mr.read(1024, 0) == data


@pytest.mark.parametrize('case', ['middle-for-last', 'last-too-soon', 'atomic-ack-for-read',
                                  'read-response-for-atomic', 'read-response-for-write',
                                  'read-response-with-a-nak', 'atomic-ack-with-a-nak'])
def test_unexpected_response_opcode_is_a_bad_response(rig, case):
    """A response at the expected PSN whose opcode cannot answer the request there
    (the IBA's unexpected opcode; datenlord/roce-sim's bad response case is a READ
    MIDDLE where its LAST is due), or a READ response or ATOMIC ACKNOWLEDGE whose
    AETH holds a NAK (a responder NAKs in an ACKNOWLEDGE: this one answers
    nothing, and its data is not placed), completes the WQE with BAD_RESP_ERR
    and takes the QP to ERR, the WRs behind it flushed."""
    rig.connect()
    data = bytes(range(256))
    if case in ('middle-for-last', 'last-too-soon', 'atomic-ack-for-read',
                'read-response-with-a-nak'):
        first = rig.wr(1, e.IBV_WR_RDMA_READ, 0, 1024)
        opcode, wc_opcode = READ_REQUEST, e.IBV_WC_RDMA_READ
    elif case in ('read-response-for-atomic', 'atomic-ack-with-a-nak'):
        first = rig.wr(1, e.IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8, add=1)
        opcode, wc_opcode = FETCH_ADD, e.IBV_WC_FETCH_ADD
    else:
        first = rig.wr(1, e.IBV_WR_RDMA_WRITE, 0, 64)
        opcode, wc_opcode = WRITE_ONLY, e.IBV_WC_RDMA_WRITE
    rig.post(first, rig.wr(2, e.IBV_WR_RDMA_WRITE, 2048, 64))
    seen = rig.peer.expect(2)
    assert [p.opcode for p in seen] == [opcode, WRITE_ONLY]
    if case == 'middle-for-last':
        rig.peer.send(READ_FIRST, 0, syndrome=SYN_ACK, msn=1, payload=data)
        rig.peer.send(READ_MIDDLE, 1, payload=data)
        rig.peer.send(READ_MIDDLE, 2, payload=data)
        rig.peer.send(READ_MIDDLE, 3, payload=data)
    elif case == 'last-too-soon':
        rig.peer.send(READ_FIRST, 0, syndrome=SYN_ACK, msn=1, payload=data)
        rig.peer.send(READ_LAST, 1, syndrome=SYN_ACK, msn=1, payload=data)
    elif case == 'atomic-ack-for-read':
        rig.peer.send(ATOMIC_ACK, 0, syndrome=SYN_ACK, msn=1, orig=7)
    elif case == 'read-response-with-a-nak':
        rig.peer.send(READ_FIRST, 0, syndrome=NAK_REM_ACCESS, msn=1, payload=data)
    elif case == 'atomic-ack-with-a-nak':
        rig.peer.send(ATOMIC_ACK, 0, syndrome=NAK_REM_ACCESS, msn=1, orig=7)
    else:
        rig.peer.send(READ_ONLY, 0, syndrome=SYN_ACK, msn=1, payload=data[:64])
    got = poll(rig.side.cq, 2)
    assert [(w.wr_id, w.status) for w in got] == [(1, e.IBV_WC_BAD_RESP_ERR),
                                                  (2, e.IBV_WC_WR_FLUSH_ERR)]
    assert got[0].opcode == wc_opcode
    assert rig.qp_state == e.IBV_QPS_ERR
    assert rig.peer.quiet(0.1) == []
    assert rig.counter('rcvd_bad_response') == 1
    if case == 'read-response-with-a-nak':      # a FIRST of its place's length: not placed
        assert rig.side.mr.read(256, 0) != data


def test_an_ack_where_a_read_response_is_due_does_not_complete_the_read(rig):
    """A plain ACK at a READ's PSN carries none of its data: the READ is not
    completed by it (only its response can), it is requested again and completes
    from its response.  (A responder may send such an ACK: a duplicate WRITE is
    acknowledged with the PSN before its ePSN, which may be a READ's.)"""
    rig.connect(timeout=PATIENT)
    rig.post(rig.wr(1, e.IBV_WR_RDMA_READ, 0, 64))
    assert wire(rig.peer.expect(1)) == [(READ_REQUEST, 0)]
    rig.peer.ack(0, msn=1)
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.reth) == (READ_REQUEST, 0, (RVA, RKEY, 64))
    assert rig.side.cq.poll()[0] == 0
    rig.peer.send(READ_ONLY, 0, syndrome=SYN_ACK, msn=1, payload=b'z' * 64)
    (wc,) = poll(rig.side.cq)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (1, e.IBV_WC_SUCCESS,
                                                            e.IBV_WC_RDMA_READ, 64)
    assert rig.side.mr.read(64, 0) == b'z' * 64


def test_unknown_response_opcode_is_dropped_and_counted(rig):
    """An opcode the IBA reserves (RC 0x1F) fails header validation: dropped
    without an answer, the READ then completes from its real response."""
    rig.connect()
    rig.post(rig.wr(1, e.IBV_WR_RDMA_READ, 0, 64))
    assert wire(rig.peer.expect(1)) == [(READ_REQUEST, 0)]
    before = rig.counter('rcvd_malformed')
    rig.peer.send(0x1F, 0, payload=b'x' * 64)
    assert rig.peer.quiet(0.05) == []
    rig.peer.send(READ_ONLY, 0, syndrome=SYN_ACK, msn=1, payload=b'y' * 64)
    assert wcs(rig.side.cq, 1) == [(1, e.IBV_WC_SUCCESS)]
    assert rig.counter('rcvd_malformed') == before + 1
    assert rig.side.mr.read(64, 0) == b'y' * 64


@pytest.mark.parametrize('syndrome,status', [
    (NAK_REM_ACCESS, e.IBV_WC_REM_ACCESS_ERR),
    (NAK_INV_REQ, e.IBV_WC_REM_INV_REQ_ERR),
    (NAK_REM_OP, e.IBV_WC_REM_OP_ERR)], ids=['remote-access', 'invalid-request', 'remote-op'])
def test_error_nak_completes_with_its_status_and_flushes_the_rest(rig, syndrome, status):
    rig.connect()
    rig.post(rig.wr(1, e.IBV_WR_RDMA_WRITE, 0, 64), rig.wr(2, e.IBV_WR_RDMA_WRITE, 64, 64))
    assert wire(rig.peer.expect(2)) == [(WRITE_ONLY, 0), (WRITE_ONLY, 1)]
    rig.peer.ack(0, syndrome, msn=0)
    assert wcs(rig.side.cq, 2) == [(1, status), (2, e.IBV_WC_WR_FLUSH_ERR)]
    assert rig.qp_state == e.IBV_QPS_ERR
    assert rig.peer.quiet(0.1) == []


# ====================================================================== softnic as responder


def _u64(v: int) -> bytes:
    return v.to_bytes(8, sys.byteorder)         # an atomic's operand in the target's memory


def _refused(rig, expect_syndrome):
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.syndrome, p.msn) == (ACK, 0, expect_syndrome, 0)
    assert rig.peer.quiet(0.05) == []
    assert rig.qp_state == e.IBV_QPS_ERR      # the responder's QP too (as rxe's)


def test_bad_rkey_is_a_remote_access_nak(rig):
    rig.connect()
    mr = rig.side.mr
    rig.peer.send(WRITE_ONLY, 0, reth=(mr.buf, mr.rkey ^ 0x5A00, 16), payload=b'w' * 16,
                  ackreq=True)
    _refused(rig, NAK_REM_ACCESS)
    assert rig.side.mr.read(16, 0) == b'\0' * 16


def test_out_of_bounds_is_a_remote_access_nak(rig):
    rig.connect()
    mr = rig.side.mr
    rig.peer.send(READ_REQUEST, 0, reth=(mr.buf + (1 << 16) - 8, mr.rkey, 16), ackreq=True)
    _refused(rig, NAK_REM_ACCESS)


@pytest.mark.parametrize('what', ['write', 'read', 'atomic'])
def test_a_disabled_access_right_is_a_remote_access_nak(rig, what):
    """An MR registered without the right the request needs (the QP allows it)."""
    rights = {'write': e.IBV_ACCESS_REMOTE_WRITE, 'read': e.IBV_ACCESS_REMOTE_READ,
              'atomic': e.IBV_ACCESS_REMOTE_ATOMIC}
    access = e.IBV_ACCESS_LOCAL_WRITE
    for k, v in rights.items():
        if k != what:
            access |= v
    mr = MR(rig.side.pd, 4096, access)
    rig.connect()
    if what == 'write':
        rig.peer.send(WRITE_ONLY, 0, reth=(mr.buf, mr.rkey, 8), payload=b'w' * 8)
    elif what == 'read':
        rig.peer.send(READ_REQUEST, 0, reth=(mr.buf, mr.rkey, 8))
    else:
        rig.peer.send(FETCH_ADD, 0, atomic=(mr.buf, mr.rkey, 1, 0))
    _refused(rig, NAK_REM_ACCESS)
    assert mr.read(8, 0) == b'\0' * 8
    mr.close()


def test_middle_without_first_is_an_invalid_request_nak(rig):
    rig.connect()
    rig.peer.send(WRITE_MIDDLE, 0, payload=b'm' * MTU)
    _refused(rig, NAK_INV_REQ)


def test_send_longer_than_its_receive_is_an_invalid_request_nak(rig):
    """A SEND longer than the receive it lands in: NAK invalid request, the receive
    completes with LOC_LEN_ERR, the QP goes to ERR and the other receives are flushed."""
    rig.connect()
    mr = rig.side.mr
    for wr_id in (1, 2):
        rig.side.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1,
                                     sg=[SGE(mr.buf + 128 * wr_id, 100, mr.lkey)]))
    rig.peer.send(SEND_ONLY, 0, payload=b'L' * 200)
    _refused(rig, NAK_INV_REQ)
    got = poll(rig.side.cq, 2)
    assert [(w.wr_id, w.status) for w in got] == [(1, e.IBV_WC_LOC_LEN_ERR),
                                                  (2, e.IBV_WC_WR_FLUSH_ERR)]


def test_one_sequence_nak_per_gap(rig):
    """Requests beyond a gap draw one PSN SEQUENCE ERROR NAK naming the missing
    PSN, not one per packet; the resent run is executed and
    acknowledged; a second gap draws a second NAK."""
    rig.connect()
    mr = rig.side.mr

    def write(psn):
        rig.peer.send(WRITE_ONLY, psn, reth=(mr.buf + 16 * psn, mr.rkey, 16),
                      payload=bytes([psn]) * 16)

    write(0)
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.syndrome >> 5, p.msn) == (ACK, 0, 0, 1)
    for psn in (2, 3, 4):
        write(psn)
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.syndrome, p.msn) == (ACK, 1, NAK_PSN_SEQ, 1)
    assert rig.peer.quiet(0.1) == []
    for psn in (1, 2, 3, 4):
        write(psn)
    acks = []
    while not acks or acks[-1].psn != 4:
        acks += rig.peer.expect(1)
    assert all(a.opcode == ACK and a.syndrome >> 5 == 0 for a in acks)
    assert acks[-1].msn == 5
    assert mr.read(80, 0) == b''.join(bytes([i]) * 16 for i in range(5))
    for psn in (6, 7):
        write(psn)
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.syndrome, p.msn) == (ACK, 5, NAK_PSN_SEQ, 5)
    assert rig.peer.quiet(0.05) == []
    assert rig.qp_state == e.IBV_QPS_RTS
    assert rig.counter('out_of_seq_request') >= 3


def test_duplicate_read_is_read_again(rig):
    """A duplicate READ is answered from memory as it is now, the whole READ or,
    re-issued from its middle, the rest of it."""
    rig.connect()
    mr = rig.side.mr
    mr.write(b'a' * 1024, 1024, 0)
    rig.peer.send(READ_REQUEST, 0, reth=(mr.buf, mr.rkey, 1024))
    seen = rig.peer.expect(4)
    assert wire(seen) == [(READ_FIRST, 0), (READ_MIDDLE, 1), (READ_MIDDLE, 2), (READ_LAST, 3)]
    assert [p.msn for p in seen] == [1, None, None, 1]
    assert b''.join(p.payload for p in seen) == b'a' * 1024
    mr.write(b'b' * 1024, 1024, 0)
    rig.peer.send(READ_REQUEST, 0, reth=(mr.buf, mr.rkey, 1024))
    seen = rig.peer.expect(4)
    assert wire(seen) == [(READ_FIRST, 0), (READ_MIDDLE, 1), (READ_MIDDLE, 2), (READ_LAST, 3)]
    assert b''.join(p.payload for p in seen) == b'b' * 1024
    mr.write(b'c' * 512, 512, 512)
    rig.peer.send(READ_REQUEST, 2, reth=(mr.buf + 512, mr.rkey, 512))
    seen = rig.peer.expect(2)
    assert wire(seen) == [(READ_FIRST, 2), (READ_LAST, 3)]
    assert b''.join(p.payload for p in seen) == b'c' * 512
    assert rig.qp_state == e.IBV_QPS_RTS


def test_duplicate_atomic_is_replayed_not_executed_again(rig):
    rig.connect()
    mr = rig.side.mr
    mr.write(_u64(10), 8, 0)
    rig.peer.send(FETCH_ADD, 0, atomic=(mr.buf, mr.rkey, 5, 0))
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.syndrome >> 5, p.msn, p.orig) == (ATOMIC_ACK, 0, 0, 1, 10)
    assert mr.read(8, 0) == _u64(15)
    rig.peer.send(FETCH_ADD, 0, atomic=(mr.buf, mr.rkey, 5, 0))     # its ACK was "lost"
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.orig) == (ATOMIC_ACK, 0, 10)
    assert mr.read(8, 0) == _u64(15)
    rig.peer.send(CMP_SWAP, 1, atomic=(mr.buf, mr.rkey, 99, 15))
    rig.peer.send(CMP_SWAP, 1, atomic=(mr.buf, mr.rkey, 99, 15))
    seen = rig.peer.expect(2)
    assert [(p.opcode, p.psn, p.orig) for p in seen] == [(ATOMIC_ACK, 1, 15)] * 2
    assert mr.read(8, 0) == _u64(99)
    assert rig.counter('atomic_replayed') == 2


def test_bad_icrc_is_dropped_and_counted(rig):
    rig.connect()
    mr = rig.side.mr
    before = rig.counter('rcvd_icrc_err')
    rig.peer.send(WRITE_ONLY, 0, reth=(mr.buf, mr.rkey, 8), payload=b'i' * 8, bad_icrc=True)
    assert rig.peer.quiet(0.1) == []
    assert rig.counter('rcvd_icrc_err') == before + 1
    assert mr.read(8, 0) == b'\0' * 8
    rig.peer.send(WRITE_ONLY, 0, reth=(mr.buf, mr.rkey, 8), payload=b'i' * 8)
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.syndrome >> 5, p.msn) == (ACK, 0, 0, 1)
    assert mr.read(8, 0) == b'i' * 8


def test_unknown_destination_qpn_is_dropped_and_counted(rig):
    rig.connect()
    mr = rig.side.mr
    before = rig.counter('rcvd_unknown_qp')
    rig.peer.send(WRITE_ONLY, 0, reth=(mr.buf, mr.rkey, 8), payload=b'q' * 8,
                  dqpn=rig.side.qp.qp_num + 1000)
    assert rig.peer.quiet(0.1) == []
    assert rig.counter('rcvd_unknown_qp') == before + 1
    assert mr.read(8, 0) == b'\0' * 8
    assert rig.qp_state == e.IBV_QPS_RTS


def test_send_with_no_receive_posted_is_an_rnr_nak(rig):
    """No receive WQE: an RNR NAK carrying the QP's min_rnr_timer, nothing
    executed, the QP still in RTS; once a receive is posted the resent SEND lands."""
    rig.connect(min_rnr_timer=12)
    rig.peer.send(SEND_ONLY, 0, payload=b's' * 100)
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.syndrome, p.msn) == (ACK, 0, SYN_RNR | 12, 0)
    assert rig.qp_state == e.IBV_QPS_RTS
    mr = rig.side.mr
    rig.side.qp.post_recv(RecvWR(wr_id=9, num_sge=1, sg=[SGE(mr.buf + 8192, 256, mr.lkey)]))
    rig.peer.send(SEND_ONLY, 0, payload=b's' * 100)
    (p,) = rig.peer.expect(1)
    assert (p.opcode, p.psn, p.syndrome >> 5, p.msn) == (ACK, 0, 0, 1)
    (wc,) = poll(rig.side.cq)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (9, e.IBV_WC_SUCCESS,
                                                            e.IBV_WC_RECV, 100)
    assert mr.read(100, 8192) == b's' * 100
    assert rig.counter('send_rnr_err') == 1


# ====================================================================== the peer itself


TSHARK_FIELDS = ['infiniband.bth.opcode', 'infiniband.bth.destqp', 'infiniband.bth.a',
                 'infiniband.bth.psn', 'infiniband.bth.padcnt', 'infiniband.reth.va',
                 'infiniband.reth.r_key', 'infiniband.reth.dmalen',
                 'infiniband.atomiceth.swapdt', 'infiniband.atomiceth.cmpdt',
                 'infiniband.aeth.syndrome', 'infiniband.aeth.msn',
                 'infiniband.atomicacketh.origremdt', 'infiniband.immdt', 'data.data']


def test_the_peer_s_packets_decode_in_tshark(tmp_path):
    """The peer's hand-packed extended headers, read back by a decoder that is
    neither scapy nor softnic: tshark's InfiniBand dissector."""
    tshark = shutil.which('tshark')
    if tshark is None:
        if os.environ.get('CI') == 'true':
            pytest.fail('tshark is required in CI')
        pytest.skip('tshark not installed')
    from scapy.layers.inet import UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    from scapy.utils import wrpcap
    from roce_peer import WRITE_ONLY_IMM, ip_header
    peer = Peer.builder('127.0.36.3', ('127.0.36.2', 4791), 0x4321)
    va, rkey = 0x1122334455667788, 0xA1B2C3D4
    cases = [
        (WRITE_FIRST, 7, dict(reth=(va, rkey, 1024), payload=b'\x11' * 256)),
        (WRITE_MIDDLE, 8, dict(payload=b'\x22' * 256)),
        (WRITE_ONLY_IMM, 9, dict(reth=(va, rkey, 5), payload=b'\x33' * 5, imm=0xCAFEF00D,
                                 ackreq=True)),
        (READ_REQUEST, 10, dict(reth=(va, rkey, 4096), ackreq=True)),
        (FETCH_ADD, 11, dict(atomic=(va, rkey, 5, 0))),
        (CMP_SWAP, 12, dict(atomic=(va, rkey, 99, 15))),
        (ACK, 13, dict(syndrome=NAK_PSN_SEQ, msn=0x123456)),
        (ATOMIC_ACK, 14, dict(syndrome=SYN_ACK, msn=2, orig=0xFEDCBA9876543210)),
        (READ_ONLY, 0xFFFFFF, dict(syndrome=SYN_ACK, msn=3, payload=b'\x44' * 6)),
    ]
    frames = []
    for opcode_, psn, kw in cases:
        data = peer.packet(opcode_, psn, dqpn=0x4321, **kw)
        frames.append(Ether() / ip_header(peer.ip, peer.dev[0]) / UDP(sport=4791, dport=4791) /
                      Raw(data))
    pcap = tmp_path / 'peer.pcap'
    wrpcap(str(pcap), frames)
    cmd = [tshark, '-r', str(pcap), '-T', 'fields', '-E', 'occurrence=f']
    for f in TSHARK_FIELDS:
        cmd += ['-e', f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [dict(zip(TSHARK_FIELDS, line.split('\t'))) for line in out.splitlines()]
    assert len(rows) == len(cases)

    def num(text):
        return None if text == '' else int(text, 0) if text not in ('True', 'False') \
            else int(text == 'True')

    for row, (opcode_, psn, kw) in zip(rows, cases):
        payload = kw.get('payload', b'')
        va_rkey = kw.get('reth') or kw.get('atomic')  # tshark names an AtomicETH's VA, R_Key so
        want = {
            'infiniband.bth.opcode': opcode_, 'infiniband.bth.destqp': 0x4321,
            'infiniband.bth.a': int(kw.get('ackreq', False)), 'infiniband.bth.psn': psn,
            'infiniband.bth.padcnt': -len(payload) % 4,
            'infiniband.reth.va': va_rkey and va_rkey[0],
            'infiniband.reth.r_key': va_rkey and va_rkey[1],
            'infiniband.reth.dmalen': kw['reth'][2] if 'reth' in kw else None,
            'infiniband.atomiceth.swapdt': kw['atomic'][2] if 'atomic' in kw else None,
            'infiniband.atomiceth.cmpdt': kw['atomic'][3] if 'atomic' in kw else None,
            'infiniband.aeth.syndrome': kw.get('syndrome'),
            'infiniband.aeth.msn': kw.get('msn') if 'syndrome' in kw else None,
            'infiniband.atomicacketh.origremdt': kw.get('orig'),
        }
        got = {f: num(row[f]) for f in want}
        assert got == want, (opcode_, row)
        assert row['infiniband.immdt'] == (f"{kw['imm']:08x}" if 'imm' in kw else '')
        assert row['data.data'] == (payload + bytes(-len(payload) % 4)).hex()
