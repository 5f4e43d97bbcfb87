"""The CQ's mirror (softnic/core/cq.py): the view a C face's ibv_poll_cq reads
without entering Python (shim.c's sn_cq_idle) must say [completions queued, or -1
once overflowed or closed; armed and not polled since] after every operation, or an
empty-looking CQ would hide a completion from a spinning program, or the first poll
after an arm (a program about to sleep on its channel) would not reach Python."""

from __future__ import annotations

import array

from hypothesis import given, settings, strategies as st

from softnic.core.cq import CQ, WC
from softnic.core.enums import WCOpcode, WCStatus

OPS = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(1, 3), st.booleans(), st.booleans()),
    st.tuples(st.just("poll"), st.integers(1, 4)),
    st.tuples(st.just("notify"), st.booleans()),
    st.tuples(st.just("clean"), st.integers(1, 3)),
    st.tuples(st.just("close"),)), max_size=60)


def _expected(cq: CQ) -> list[int]:
    return [-1 if cq.overflowed or cq.closed else len(cq.entries), int(cq.arm_unpolled)]


@settings(max_examples=300)
@given(st.integers(1, 6), OPS)
def test_the_mirror_follows_every_operation(depth, ops):
    cq = CQ(1, depth)
    cq.mirror = array.array("i", [0, 0])
    cq.mirrored()
    for op in ops:
        if op[0] == "push":
            _, qpn, solicited, ok = op
            cq.push(WC(0, WCStatus.SUCCESS if ok else WCStatus.WR_FLUSH_ERR,
                       WCOpcode.SEND, qpn), solicited=solicited)
        elif op[0] == "poll":
            try:
                cq.poll(op[1])
            except Exception:
                assert cq.overflowed
        elif op[0] == "notify":
            cq.req_notify(op[1])
        elif op[0] == "clean":          # as QP.clean_cqs drops a reset QP's completions
            keep = [w for w in cq.entries if w.qp_num != op[1]]
            cq.entries.clear()
            cq.entries.extend(keep)
            cq.mirrored()
        else:
            cq.closed = True
            cq.mirrored()
        assert list(cq.mirror) == _expected(cq), (op, list(cq.mirror), _expected(cq))


def test_arm_unpolled_is_an_arm_no_poll_has_followed():
    """The first poll after ibv_req_notify_cq is a program about to sleep on its
    channel (arm, poll for what came meanwhile, sleep); a CQ polled again while
    still armed is a program spinning on it."""
    cq = CQ(1, 4)
    cq.mirror = array.array("i", [0, 0])
    cq.mirrored()
    assert not cq.arm_unpolled
    cq.req_notify()
    assert cq.armed and cq.arm_unpolled and list(cq.mirror) == [0, 1]
    assert cq.poll(1) == []
    assert cq.armed and not cq.arm_unpolled and list(cq.mirror) == [0, 0]
    cq.req_notify()                                   # armed again: so it is again
    assert cq.arm_unpolled and list(cq.mirror) == [0, 1]
    cq.push(WC(0, WCStatus.SUCCESS, WCOpcode.SEND, 1))  # the event: disarmed
    assert not cq.armed and not cq.arm_unpolled and list(cq.mirror) == [1, 0]
    cq.req_notify(True)                               # solicited only: a plain one leaves it
    cq.push(WC(1, WCStatus.SUCCESS, WCOpcode.SEND, 1))
    assert cq.armed and cq.arm_unpolled and list(cq.mirror) == [2, 1]


def test_an_arm_over_completions_not_yet_polled_raises_the_event_at_once():
    """ibv_req_notify_cq as mlx5 has it (armed at the consumer index): completions
    queued and not polled raise the event when the CQ is armed; an arm for
    solicited completions only, when one of them is solicited or an error."""
    cq = CQ(1, 8)
    raised = []
    cq.on_event = raised.append
    plain = lambda i, st=WCStatus.SUCCESS: WC(i, st, WCOpcode.RECV, 1)   # noqa: E731
    cq.push(plain(0))
    assert not raised
    cq.req_notify()
    assert raised == [cq] and cq.events == 1 and not cq.armed
    assert [w.wr_id for w in cq.poll(4)] == [0]
    cq.req_notify()                                   # nothing queued: armed
    assert cq.events == 1 and cq.armed
    cq.push(plain(1))                                 # the next completion raises it
    assert cq.events == 2 and not cq.armed
    cq.req_notify(True)                               # only a plain one queued
    assert cq.events == 2 and cq.armed
    cq.push(plain(2), solicited=True)
    assert cq.events == 3 and not cq.armed
    cq.req_notify(True)                               # a solicited one queued
    assert cq.events == 4 and not cq.armed
    assert [w.wr_id for w in cq.poll(4)] == [1, 2]
    cq.push(plain(3, WCStatus.REM_ACCESS_ERR))        # not armed: no event
    assert cq.events == 4
    cq.req_notify(True)                               # an error queued
    assert cq.events == 5 and raised == [cq] * 5
