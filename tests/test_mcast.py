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
from test_libibverbs import libdir, run  # noqa: F401 (libdir: a fixture)

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



C_PROG = r"""
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>
int main(int argc, char **argv)
{
    struct ibv_device **l = ibv_get_device_list(NULL);
    struct ibv_context *ctx = ibv_open_device(l[0]);
    struct ibv_device_attr a;
    ibv_query_device(ctx, &a);
    printf("limits %d %d %d\n", a.max_mcast_grp, a.max_mcast_qp_attach,
           a.max_total_mcast_qp_attach);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
    struct ibv_qp_init_attr i = {.send_cq = cq, .recv_cq = cq,
                                 .cap = {.max_send_wr = 1, .max_recv_wr = 1,
                                         .max_send_sge = 1, .max_recv_sge = 1}};
    i.qp_type = IBV_QPT_UD;
    struct ibv_qp *ud = ibv_create_qp(pd, &i);
    i.qp_type = IBV_QPT_RC;
    struct ibv_qp *rc = ibv_create_qp(pd, &i);
    union ibv_gid g, u;
    inet_pton(AF_INET6, argv[1], g.raw);
    inet_pton(AF_INET6, "::ffff:10.0.0.1", u.raw);
    printf("rc %d\n", ibv_attach_mcast(rc, &g, 0));
    printf("unicast %d\n", ibv_attach_mcast(ud, &u, 0));
    printf("detach-unattached %d\n", ibv_detach_mcast(ud, &g, 0));
    printf("attach %d", ibv_attach_mcast(ud, &g, 0));
    printf(" %d\n", ibv_attach_mcast(ud, &g, 0));
    printf("detach %d", ibv_detach_mcast(ud, &g, 0));
    printf(" %d\n", ibv_detach_mcast(ud, &g, 0));
    ibv_destroy_qp(ud);
    ibv_destroy_qp(rc);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(l);
    return 0;
}
"""


def test_c_face_attach_detach_errnos(tmp_path, libdir):
    """softnic's libibverbs.so.1: the same limits and errnos through ibv_attach_mcast /
    ibv_detach_mcast (pyverbs has no call for them: rdma_cm makes them)."""
    src, exe = tmp_path / "mcast.c", tmp_path / "mcast"
    src.write_text(C_PROG)
    r = subprocess.run(["gcc", "-O1", "-Wall", "-Werror", "-o", str(exe), str(src), "-libverbs"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = run(str(exe), _group(3))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.split('\n')
    assert 'limits 8192 56 458752' in lines
    assert f'rc {errno.EINVAL}' in lines
    assert f'unicast {errno.EINVAL}' in lines
    assert f'detach-unattached {errno.EINVAL}' in lines
    assert 'attach 0 0' in lines
    assert f'detach 0 {errno.EINVAL}' in lines


def test_is_group_tells_a_group_from_any_other_destination_and_remembers_its_answers():
    """``is_group`` (asked of every datagram a flush sends): IPv4 224/4 and IPv6 ff00::/8
    are groups; a unicast address, a broadcast one or a string that is no address is not;
    a second asking gives the first answer (remembered, not asked of ``ipaddress``)."""
    from softnic.driver import mcast
    cases = {"239.1.2.3": True, "224.0.0.1": True, "ff02::1": True, "ff1e::42": True,
             "10.0.0.2": False, "127.0.0.1": False, "255.255.255.255": False, "fe80::1": False,
             "::1": False, "softnic0": False, "": False}
    mcast.is_group.cache_clear()
    for ip, group in cases.items():
        assert mcast.is_group(ip) is group, ip
    for ip, group in cases.items():
        assert mcast.is_group(ip) is group, ip
    info = mcast.is_group.cache_info()
    assert info.hits == len(cases) and info.misses == len(cases)
