"""UD multicast (softnic/driver/mcast.py) through the Python face.

ibv_attach_mcast / ibv_detach_mcast's errnos are rxe's (the kernel's ib_attach_mcast:
EINVAL for a QP that is not UD or a GID that is no multicast address; detaching a QP that
is not attached: EINVAL).  A UD send to a group's GID with DQPN 0xFFFFFF reaches a QP
attached to it in another process (each process its own device), carries the payload and
the Q_Key check, and stops reaching it once the QP is detached.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import verbs_api.enums as e
from verbs_api.addr import GID
from verbs_api.pyverbs_error import PyverbsRDMAError

from verbskit import Side

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def _group(n: int) -> str:
    """A group of this test run's own (tests in parallel runs do not meet)."""
    return f"::ffff:230.{(os.getpid() >> 8) & 0xFF}.{os.getpid() & 0xFF}.{n}"


def _errno_of(fn) -> int:
    with pytest.raises(PyverbsRDMAError) as ei:
        fn()
    return ei.value.error_code


def test_device_reports_multicast_limits():
    s = Side('softnic0', qp_type=e.IBV_QPT_UD)
    try:
        a = s.ctx.query_device()
        assert a.max_mcast_grp == 8192
        assert a.max_mcast_qp_attach == 56
        assert a.max_total_mcast_qp_attach == 0x70000
    finally:
        s.close()


def test_attach_detach_errnos():
    ud = Side('softnic0', qp_type=e.IBV_QPT_UD)
    rc = Side('softnic0', qp_type=e.IBV_QPT_RC, ctx=ud.ctx, pd=ud.pd)
    try:
        g = GID(_group(1))
        assert _errno_of(lambda: rc.qp.attach_mcast(g, 0)) == errno.EINVAL     # not UD
        assert _errno_of(lambda: ud.qp.attach_mcast(GID('::ffff:10.0.0.1'), 0)) == errno.EINVAL
        assert _errno_of(lambda: ud.qp.detach_mcast(g, 0)) == errno.EINVAL     # not attached
        ud.qp.attach_mcast(g, 0)
        ud.qp.attach_mcast(g, 0)                  # again: 0, as rxe
        ud.qp.detach_mcast(g, 0)
        assert _errno_of(lambda: ud.qp.detach_mcast(g, 0)) == errno.EINVAL
    finally:
        rc.close()
        ud.close()


RECEIVER = textwrap.dedent('''
    import sys, time
    sys.path.insert(0, sys.argv[3])
    import verbs_api.enums as e
    from verbs_api.addr import GID
    from verbs_api.wr import RecvWR, SGE
    from verbskit import Side, poll, GRH_SIZE
    s = Side('softnic0', qp_type=e.IBV_QPT_UD)
    g = GID(sys.argv[1])
    s.qp.attach_mcast(g, 0)
    for i in range(2):
        s.qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(s.mr.buf, s.mr.length, s.mr.lkey)]))
    print('ready', flush=True)
    wc, = poll(s.cq, 1, timeout=20)
    assert wc.status == e.IBV_WC_SUCCESS, wc.status
    assert wc.byte_len == GRH_SIZE + 64, wc.byte_len
    assert s.mr.read(64, GRH_SIZE) == b'm' * 64
    s.qp.detach_mcast(g, 0)
    print('detached', flush=True)
    sys.stdin.readline()                      # the sender has sent again
    time.sleep(0.5)
    n, _ = s.cq.poll(1)
    print('after-detach', n, flush=True)
''')


def test_ud_multicast_between_two_processes(tmp_path):
    env = {**os.environ, 'PYTHONPATH': f'{ROOT}{os.pathsep}{TESTS}'}
    group = _group(2)
    rx = subprocess.Popen([sys.executable, '-c', RECEIVER, group, '', str(TESTS)], env=env,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == 'ready'
        from verbs_api.addr import AH, AHAttr, GlobalRoute
        from verbs_api.wr import SGE, SendWR
        from verbskit import UD_QKEY, poll
        s = Side('softnic0', qp_type=e.IBV_QPT_UD)
        try:
            ah = AH(s.pd, attr=AHAttr(port_num=1, is_global=1,
                                      gr=GlobalRoute(dgid=GID(group), sgid_index=0)))

            def send(qkey, fill=b'm'):
                s.mr.write(fill * 64, 64)
                wr = SendWR(wr_id=1, opcode=e.IBV_WR_SEND, num_sge=1,
                            sg=[SGE(s.mr.buf, 64, s.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
                wr.set_wr_ud(ah, 0xFFFFFF, qkey)
                s.qp.post_send(wr)
                wc, = poll(s.cq, 1)
                assert wc.status == e.IBV_WC_SUCCESS

            send(UD_QKEY + 1, b'x')               # a wrong Q_Key: dropped by the receiver
            send(UD_QKEY)
            assert rx.stdout.readline().strip() == 'detached'
            send(UD_QKEY)                         # no member now: reaches no one
            rx.stdin.write('\n')
            rx.stdin.flush()
            assert rx.stdout.readline().split() == ['after-detach', '0']
        finally:
            s.close()
        assert rx.wait(timeout=30) == 0
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait(timeout=10)
