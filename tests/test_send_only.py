"""A SEND of one packet taken by its edge (``responder.receive_edge`` of an ONLY,
and its compiled twin, ``softnic.accel``'s ``responder.c``, a device's
``Dispatch._send_only``) against the general path (``receive_datagram`` ->
``receive_common`` -> ``execute`` -> ``_send``).

Three receivers are made alike: a device with the kernel, an RC QP connected to
a sender's, receives posted (on the QP, or on an SRQ; of one SGE, or two; long
enough or not); a plain ACK queued or not; a hole's bookkeeping left over or
not.  The sender builds a SEND ONLY (plain, with an immediate, with an
invalidation of a key the receiver has or has not; solicited or not; of 0 to
an MTU's bytes), and the datagram is handed to the three as drawn: as built,
a byte changed (its ICRC then wrong), to another QP, from another peer, with
FECN set, at another PSN, with no receive posted, with a message under way,
with a packet held out of order, the QP in another state, the device checking
no ICRCs; the receive CQ armed (for solicited events only, or any) or not.
One takes it by the general path alone, one by the Python's edge and the
general path for what the edge leaves, one by the compiled edge and the
general path for what it leaves.  The receive memory, the responder's state,
its queued ACKs and NAKs, the completions, the counters, the CQ's events and
the device's ready QPs must be the same in all three, and the two edges must
take or leave the same datagrams.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings, strategies as st

from softnic.core import responder
from softnic.core.device import Device
from softnic.core.enums import WROpcode as W
from test_send_runs import RECEIVER_DRAWS, _mutate as _run_mutate, _pair, _receiver_as_drawn, \
    _state
from test_send_runs import compiled  # noqa: F401 (its fixture)

MTU = 1024


def _world(seed: int, draw: dict):
    """The sender's SEND ONLY (its datagram) and the receiver's world."""
    rng = random.Random(seed)
    a = Device("a", "10.0.0.1")
    b, ea, eb = _pair(rng, draw, a, draw["size"])
    eb.buf.view[:] = rng.randbytes(len(eb.buf.view))
    (data, _), = a.datagrams_to_send(0.0)
    data = bytearray(data)
    _receiver_as_drawn(draw, eb)
    return b, eb.qp, eb, data, a.address


def _mutate(draw: dict, data: bytearray, src):
    """The datagram as it arrives: a byte changed, another QP or PSN, FECN, another
    peer (``test_send_runs``' changes of a run, of a run of one datagram, not cut)."""
    return _run_mutate(dict(draw, cut=0), data, len(data), src)


_draws = st.fixed_dictionaries({
    **RECEIVER_DRAWS,
    "psn": st.sampled_from([0, 0xFFFFFF]),
    "size": st.sampled_from([0, 1, 3, 4, 8, 100, MTU - 4, MTU - 1, MTU]),
    "room": st.sampled_from([0, 0, 64, -1]),
    "flip": st.one_of(st.none(), st.none(), st.none(), st.integers(0, 2000)),
})


def _draw(**values) -> dict:
    """A clean draw: a plain SEND ONLY of 100 bytes into one receive, but ``values``."""
    d = dict(check_icrc=True, srq=False, psn=0, size=100, posted=1, room=0, two_sges=False,
             op=W.SEND, inv_known=True, se=False, state=None, under_way=False, ooo=False,
             flip=None, qpn=0, psn_off=0, fecn=False, peer=False, arm=None, acked=False,
             stale_sr=False)
    d.update(values)
    return d


def _general(dev, data, src) -> None:
    return None


@settings(max_examples=600, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), draw=_draws)
@example(seed=1, draw=_draw())
@example(seed=1, draw=_draw(op=W.SEND_WITH_INV, inv_known=True, size=MTU - 1, se=True,
                            arm=True))
@example(seed=1, draw=_draw(op=W.SEND_WITH_INV, inv_known=False))
@example(seed=1, draw=_draw(op=W.SEND_WITH_IMM, size=0, srq=True, stale_sr=True))
@example(seed=1, draw=_draw(acked=True, psn=0xFFFFFF))
def test_the_edges_take_a_send_only_as_the_general_path(compiled, seed, draw):
    results = []
    for edge in (_general, responder.receive_edge, compiled.receive_send_only):
        dev, qp, eb, data, src = _world(seed, draw)
        data, src = _mutate(draw, data, src)
        # (as Dispatch.receive_run routes it: a SEND ONLY's opcode to its edge)
        took = edge(dev, memoryview(data), src) if data[0] in responder.SEND_ONLYS else None
        if not took:
            dev.receive_datagram(bytes(data), src, 0.0)
        results.append((took, _state(dev, qp, eb)))
    assert results[1][1] == results[0][1], "the Python's edge"
    assert results[2] == results[1], "the compiled edge"


#: what the Python's edge calls and the compiled one does in C (the QP's conditions,
#: the kernel's call, the accounting of an ONLY), and the general path
_PYTHONS = ("_common_qp", "kernel_edge", "_only_taken", "receive_common")


@pytest.mark.parametrize("which", ["python", "compiled"])
def test_a_clean_send_only_is_taken_by_the_compiled_edge(compiled, record_calls, which):
    """Not a vacuous property: the compiled edge takes a clean SEND ONLY itself,
    calling none of the Python's edge's own steps (this fails if it hands every
    datagram to the Python, which calls each of them but the general path's),
    and the receive completes with its bytes."""
    dev, qp, eb, data, src = _world(1, _draw(op=W.SEND_WITH_IMM))
    called = record_calls(responder, _PYTHONS)
    edge = compiled.receive_send_only if which == "compiled" else responder.receive_edge
    assert edge(dev, memoryview(data), src) is True
    assert called == ([] if which == "compiled" else list(_PYTHONS[:3]))
    wcs = dev.poll_cq(eb.recv_cq, 4)
    assert [(w.wr_id, w.byte_len, w.imm_data) for w in wcs] == [(10, 100, 0xABCD)]
    assert bytes(eb.buf.view[0:100]) == bytes(data[16:116])
    assert qp.resp.epsn == 1 and qp.resp.msn == 1 and list(qp.resp.out) == [
        (0, responder.ACK_CREDITS, 1)]


def test_a_receive_edge_put_in_the_modules_place_is_called(compiled, monkeypatch):
    """A ``receive_edge`` put in the module's place (a test's stand-in, a tracer)
    is the one the compiled ``_send_only`` calls."""
    dev, qp, eb, data, src = _world(1, _draw())
    seen = []
    monkeypatch.setattr(responder, "receive_edge",
                        lambda *a: (seen.append(len(a)), False)[1])
    assert compiled.receive_send_only(dev, memoryview(data), src) is False
    assert seen == [3] and qp.resp.epsn == 0
