"""The C face's send and receive records posted by the compiled post
(softnic/accel/post.c's ``post_records`` and ``post_recvs``) against the Python's
(``backend._send_wr`` and ``Verbs.post_send``; ``_recv_wr`` and ``post_recv`` or
``post_srq_recv``), record by record.

Two QPs alike take the same chain of api.h records: one through ``post_records``
and then, from the first record it leaves, ``backend._post_chain``; the other
through ``_post_chain`` alone.  Whatever the chain holds (every WR opcode and an
unknown one, SGE counts past the QP's, inline sends too long, ATOMICs of the
wrong length or alignment, a full send queue, a QP not in RTS), the two post
the same records, refuse the same one with the same errno, and leave the same
send queues, field for field of every WQE, and the same QPs ready.  Without a C
compiler the extension cannot be built and this skips, except in CI (``CI``
set), which fails instead.
"""

from __future__ import annotations

import os
from functools import partial

import pytest
from hypothesis import given, note, settings, strategies as st

from softnic import accel
from softnic.core.device import Device
from softnic.core.enums import QPAttrMask, QPState, SendFlags, WROpcode as W
from softnic.core.errors import VerbsError
from softnic.core.enums import QPType
from softnic.core.qp import QPAttr, QPCap, QPInitAttr, RecvWR, SendWQE
from softnic.experiments.rig import connect
from softnic.faces.libibverbs import backend, build


def _fast():
    m = accel.fabric_loop()
    if m is None:
        if os.environ.get("CI"):
            pytest.fail(f"the compiled extension is needed here: {accel.fabric_error}")
        pytest.skip(f"no compiled extension: {accel.fabric_error}")
    return m


_FFI = build.LIBRARY.records_ffi((build.LIBRARY.here / "api.h").read_text())

#: every WR opcode, and one no verbs provider knows
OPCODES = [int(w) for w in W] + [11]
FLAGS = [int(f) for f in (SendFlags.SIGNALED, SendFlags.INLINE, SendFlags.SOLICITED,
                          SendFlags.FENCE)]


def _pair(depth: int, sq_sig_all: bool):
    a, b = Device("a", "10.0.0.1"), Device("b", "10.0.0.2")
    ea, _ = connect(a, b, mtu=1024, endpoint_args={"buf_size": 1 << 14, "max_send_wr": depth,
                                                   "max_sge": 4, "max_inline": 64,
                                                   "sq_sig_all": sq_sig_all})
    ea.buf.view[:1 << 14] = bytes(range(256)) * 64
    return a, ea


def _wqe(w: SendWQE) -> dict:
    return {name: getattr(w, name) for name in SendWQE.__slots__}


#: the opcodes the compiled post takes, more often than the rest: a chain goes on
#: through it only while each record is one it takes
_TAKEN = [int(op) for op in backend._FAST_POST]

record = st.fixed_dictionaries({
    "wr_id": st.integers(0, 2**64 - 1),
    "opcode": st.sampled_from(_TAKEN * 4 + OPCODES),
    "num_sge": st.sampled_from([1] * 8 + [0, 2, 3, 5]),
    "sges": st.lists(st.tuples(st.integers(0, 1 << 13),
                               st.sampled_from([8] * 8 + [0, 1, 63, 64, 65, 100]),
                               st.integers(0, 2**32 - 1)), min_size=5, max_size=5),
    "flags": st.lists(st.sampled_from(FLAGS), max_size=2).map(lambda fs: sum(set(fs))),
    "imm_data": st.integers(0, 2**32 - 1),
    "invalidate_rkey": st.integers(0, 2**32 - 1),
    "remote_addr": st.one_of(st.integers(0, 2**61 - 1).map(lambda x: 8 * x),
                             st.integers(0, 2**64 - 1)),
    "rkey": st.integers(0, 2**32 - 1),
    "compare_add": st.integers(0, 2**64 - 1),
    "swap": st.integers(0, 2**64 - 1),
    "remote_qpn": st.integers(0, 2**24 - 1),
    "remote_qkey": st.integers(0, 2**32 - 1),
})


_DEFAULTS = {"wr_id": 0, "opcode": int(W.SEND), "num_sge": 1,
             "sges": [(0, 8, 0)] * 5, "flags": 0, "imm_data": 0, "invalidate_rkey": 0,
             "remote_addr": 0, "rkey": 0, "compare_add": 0, "swap": 0, "remote_qpn": 0,
             "remote_qkey": 0}


def _both_ways(chain, depth: int, queued: int, state: str, sq_sig_all: bool):
    """``chain`` (records as dicts, ``_DEFAULTS`` filling what one leaves out) posted
    to two QPs alike (``queued`` WQEs in their send queues of ``depth``, in
    ``state``): through ``post_records`` then ``_post_chain`` from the first it
    left, and through ``_post_chain`` alone.  Each way's (records posted, errno
    raised or None, the send queue's WQEs field by field, the QP marked ready),
    and how many the compiled post took."""
    post_records, _ = backend._records_post(_FFI)
    assert post_records is _fast().post_records
    chain = [{**_DEFAULTS, **r} for r in chain]
    (a1, e1), (a2, e2) = _pair(depth, sq_sig_all), _pair(depth, sq_sig_all)
    sg = _FFI.new("struct sn_sge[]", 5 * len(chain))
    ws = _FFI.new("struct sn_send_wr[]", len(chain))
    for i, r in enumerate(chain):
        w = ws[i]
        for k in ("wr_id", "opcode", "num_sge", "imm_data", "invalidate_rkey", "remote_addr",
                  "rkey", "compare_add", "swap", "remote_qpn", "remote_qkey"):
            setattr(w, k, r[k])
        w.send_flags = r["flags"]
        w.sg_list = sg + 5 * i
        for j, (off, length, lkey) in enumerate(r["sges"]):
            sg[5 * i + j].addr = e1.buf.addr + off
            sg[5 * i + j].length = length
            sg[5 * i + j].lkey = lkey
    outcomes = []
    for a, e, fast in ((a1, e1, True), (a2, e2, False)):
        for i in range(min(queued, depth)):       # WQEs already queued
            a.post_send(e.qp, backend._send_wr(_Obj(e.qp), _record_of(w_first=i)))
        if state != "RTS":
            a.modify_qp(e.qp, QPAttr(qp_state=QPState[state]), QPAttrMask.STATE)
        a._ready.clear()
        done = _FFI.new("int[1]")
        err = None
        k = 0
        try:
            if fast:
                k = post_records(a, e.qp, int(_FFI.cast("uintptr_t", ws)), len(chain))
                done[0] = k
            if k < len(chain):
                backend._post_chain(a.post_send, e.qp, partial(backend._send_wr, _Obj(e.qp)),
                                    ws, len(chain), done, k)
        except VerbsError as x:
            err = x.errno
        outcomes.append((done[0], err, [_wqe(w) for w in e.qp.sq], e.qp in a._ready, k))
    return outcomes[0][:4], outcomes[1][:4], outcomes[0][4]


@settings(max_examples=300, deadline=None)
@given(st.lists(record, min_size=1, max_size=6), st.sampled_from([2, 4, 16, 16]),
       st.integers(0, 3), st.sampled_from(["RTS", "RTS", "RTS", "SQD", "ERR"]), st.booleans())
def test_the_compiled_post_posts_as_post_send_posts(chain, depth, queued, state, sq_sig_all):
    compiled, python, took = _both_ways(chain, depth, queued, state, sq_sig_all)
    note(f"depth {depth}, queued {queued}, {state}: compiled took {took}, "
         f"{compiled[:2]} against {python[:2]}")
    assert compiled == python


_INLINE = int(SendFlags.INLINE)
_SIGNALED = int(SendFlags.SIGNALED)


@pytest.mark.parametrize("chain, depth, sig_all, took, posted, errno_", [
    # an inline SEND of max_inline_data bytes, then one of a byte more: EINVAL
    ([{"flags": _INLINE, "sges": [(0, 64, 0)]}, {"flags": _INLINE, "sges": [(0, 65, 0)]}],
     16, False, 1, 1, 22),
    # the same over two SGEs
    ([{"flags": _INLINE, "num_sge": 2, "sges": [(0, 32, 0), (100, 32, 0)]},
      {"flags": _INLINE, "num_sge": 2, "sges": [(0, 32, 0), (100, 33, 0)]}], 16, False, 1, 1, 22),
    # an aligned FETCH_ADD, then an unaligned COMPARE_SWAP, then one of 4 bytes: EINVAL
    ([{"opcode": int(W.ATOMIC_FETCH_AND_ADD), "remote_addr": 64},
      {"opcode": int(W.ATOMIC_CMP_AND_SWP), "remote_addr": 68}], 16, False, 1, 1, 22),
    ([{"opcode": int(W.ATOMIC_CMP_AND_SWP), "remote_addr": 64, "sges": [(0, 4, 0)]}],
     16, False, 0, 0, 22),
    # more SGEs than the QP takes: ENOMEM
    ([{"opcode": int(W.RDMA_READ)}, {"opcode": int(W.RDMA_WRITE), "num_sge": 5}],
     16, False, 1, 1, 12),
    # a send queue of 2: the third ENOMEM
    ([{}, {"opcode": int(W.SEND_WITH_IMM), "imm_data": 7}, {}], 2, False, 2, 2, 12),
    # a LOCAL_INV is post_send's (it and what follows), the rest before it the compiled's
    ([{"opcode": int(W.RDMA_WRITE_WITH_IMM)}, {"opcode": int(W.SEND_WITH_INV)},
      {"opcode": int(W.LOCAL_INV), "num_sge": 0}, {}], 16, False, 2, 4, None),
    # sq_sig_all: unsignaled records complete all the same
    ([{"flags": 0}, {"flags": _SIGNALED}], 16, True, 2, 2, None),
], ids=["inline-65", "inline-two-sges", "atomic-unaligned", "atomic-4-bytes", "sges",
        "queue-full", "local-inv", "sq-sig-all"])
def test_the_compiled_post_at_each_boundary(chain, depth, sig_all, took, posted, errno_):
    """Each boundary of post_send's checks, both ways: the compiled post takes the
    records before it and leaves the one at it to post_send, which refuses it
    with its errno (or posts it, and the rest)."""
    compiled, python, k = _both_ways(chain, depth, 0, "RTS", sig_all)
    assert compiled == python
    assert (k, compiled[0], compiled[1]) == (took, posted, errno_)
    if sig_all:
        assert all(w["signaled"] for w in compiled[2])


class _Obj:
    """The C face's QP object as ``_send_wr`` reads it."""

    def __init__(self, qp):
        self.eng = qp


def _record_of(w_first: int):
    """A plain SEND's record (a WQE to fill the queue with)."""
    w = _FFI.new("struct sn_send_wr *")
    w.wr_id = 1000 + w_first
    w.opcode = int(W.SEND)
    w.num_sge = 0
    return w[0]


def test_the_compiled_post_takes_the_common_case():
    """A chain of the opcodes it takes, each posted by it (none left to the Python's)."""
    m = _fast()
    post_records, _ = backend._records_post(_FFI)
    a, e = _pair(16, False)
    ops = backend._FAST_POST
    sg = _FFI.new("struct sn_sge[1]")
    sg[0].addr, sg[0].length, sg[0].lkey = e.buf.addr, 8, e.mr.lkey
    ws = _FFI.new("struct sn_send_wr[]", len(ops))
    for i, op in enumerate(ops):
        ws[i].wr_id, ws[i].opcode, ws[i].num_sge, ws[i].sg_list = i, int(op), 1, sg
        ws[i].remote_addr = 64
    assert post_records(a, e.qp, int(_FFI.cast("uintptr_t", ws)), len(ops)) == len(ops)
    assert [(w.wr_id, w.opcode) for w in e.qp.sq] == list(enumerate(ops))
    assert m.post_records is post_records


recv_record = st.fixed_dictionaries({
    "wr_id": st.integers(0, 2**64 - 1),
    "num_sge": st.sampled_from([1] * 6 + [0, 2, 3, 4, 5]),
    "sges": st.lists(st.tuples(st.integers(0, 1 << 13), st.integers(0, 2**32 - 1),
                               st.integers(0, 2**32 - 1)), min_size=5, max_size=5),
})


@settings(max_examples=200, deadline=None)
@given(st.lists(recv_record, min_size=1, max_size=6), st.booleans(), st.sampled_from([2, 4, 16]),
       st.integers(0, 3), st.sampled_from(["RTS", "RTS", "INIT", "RESET", "ERR"]))
def test_the_compiled_post_posts_receives_as_post_recv_posts(chain, srq, depth, queued, state):
    """Receive records to an SRQ (``post_srq_recv``, ``SRQ.post``: its SGE count and
    room) or to a QP's receive queue (``post_recv``: its state, its SGE count and
    room), both ways: the same records posted, the same errno, the same queue
    WQE by WQE, and the same completions (a QP in ERR flushes them)."""
    _fast()
    _, post_recvs = backend._records_post(_FFI)
    sg = _FFI.new("struct sn_sge[]", 5 * len(chain))
    ws = _FFI.new("struct sn_recv_wr[]", len(chain))
    for i, r in enumerate(chain):
        ws[i].wr_id, ws[i].num_sge, ws[i].sg_list = r["wr_id"], r["num_sge"], sg + 5 * i
        for j, (addr, length, lkey) in enumerate(r["sges"]):
            sg[5 * i + j].addr, sg[5 * i + j].length, sg[5 * i + j].lkey = addr, length, lkey
    outcomes = []
    for fast in (True, False):
        a = Device("a", "10.0.0.1")
        pd = a.alloc_pd()
        cq = a.create_cq(64)
        if srq:
            target = a.create_srq(pd, depth, 3)
            for i in range(min(queued, depth)):
                a.post_srq_recv(target, RecvWR(500 + i, [(0, 8, 0)]))
            post = a.post_srq_recv
            limit = target.max_sge
        else:
            target = a.create_qp(pd, QPInitAttr(QPType.RC, cq, cq, None,
                                                QPCap(4, depth, 1, 3, 0)))
            if state != "RESET":
                a.modify_qp(target, QPAttr(qp_state=QPState.INIT, qp_access_flags=0),
                            QPAttrMask.STATE | QPAttrMask.PKEY_INDEX | QPAttrMask.PORT
                            | QPAttrMask.ACCESS_FLAGS)
                for i in range(min(queued, depth)):
                    a.post_recv(target, RecvWR(500 + i, [(0, 8, 0)]))
            if state == "ERR":
                a.modify_qp(target, QPAttr(qp_state=QPState.ERR), QPAttrMask.STATE)
            post = a.post_recv
            limit = target.cap.max_recv_sge
        queue = target.queue if srq else target.rq
        done = _FFI.new("int[1]")
        err = None
        k = 0
        try:
            if fast:
                k = post_recvs(target, int(_FFI.cast("uintptr_t", ws)), len(chain), srq)
                done[0] = k
            if k < len(chain):
                backend._post_chain(post, target, lambda w: backend._recv_wr(w, limit), ws,
                                    len(chain), done, k)
        except VerbsError as x:
            err = x.errno
        outcomes.append((done[0], err, [(w.wr_id, w.sges, w.length) for w in queue],
                         [(w.wr_id, w.status) for w in a.poll_cq(cq, 64)], k))
    note(f"srq {srq}, depth {depth}, queued {queued}, {state}: compiled took {outcomes[0][4]}, "
         f"{outcomes[0][:2]} against {outcomes[1][:2]}")
    assert outcomes[0][:4] == outcomes[1][:4]
    if not srq and state in ("RESET", "ERR"):
        assert outcomes[0][4] == 0                  # post_recv's, all of it


def test_the_compiled_post_takes_receives_to_the_limit():
    """A chain one longer than an SRQ's room: all but the last posted by it, the last
    refused by ``SRQ.post`` (ENOMEM); one with an SGE too many refused at it (EINVAL)."""
    _fast()
    _, post_recvs = backend._records_post(_FFI)
    a = Device("a", "10.0.0.1")
    srq = a.create_srq(a.alloc_pd(), 4, 2)
    sg = _FFI.new("struct sn_sge[3]")
    ws = _FFI.new("struct sn_recv_wr[5]")
    for i in range(5):
        ws[i].wr_id, ws[i].num_sge, ws[i].sg_list = i, 1, sg
    ws[1].num_sge = 3
    assert post_recvs(srq, int(_FFI.cast("uintptr_t", ws)), 5, True) == 1
    ws[1].num_sge = 2
    assert post_recvs(srq, int(_FFI.cast("uintptr_t", ws + 1)), 4, True) == 3
    assert [w.wr_id for w in srq.queue] == [0, 1, 2, 3]
    with pytest.raises(VerbsError) as e:
        a.post_srq_recv(srq, backend._recv_wr(ws[4], srq.max_sge))
    assert e.value.errno == 12
