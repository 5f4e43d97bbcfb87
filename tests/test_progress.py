"""The live NIC's event-driven progress thread (softnic/driver/nic.py, accel/wait.c).

``sn_wait`` is checked on its own with a socket pair and an eventfd: what each
answer means, the inline caller's lease, the deadline shared through memory.
Then live NICs: a WRITE lands and a SEND completes while the program does not
call softnic at all (the thread did it: its counters say why it woke), a
waiter in ``wait_until`` is woken by the step that made its completion (no
clock polling), a verbs call that arms an earlier timer rings the bell, and
the same without the compiled sleep (``select.poll``).  Nothing here depends
on how fast anything runs: time limits are seconds, for a hang.
"""

from __future__ import annotations

import errno
import hashlib
import os
import select
import socket
import sys
import threading
import time

import pytest

from softnic import accel
from softnic.driver import nic as nicmod
from softnic.driver.config import DeviceSpec, RuntimeConfig
from softnic.core.enums import SendFlags, WROpcode as W
from softnic.core.qp import RecvWR, SendWR
from softnic.driver.nic import NIC
from softnic.experiments.rig import bring_up, endpoint

NS = 1_000_000_000


def _waiter():
    k = accel.waiter()
    if k is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the compiled sleep must build in CI: {accel._error}")
        pytest.skip(f"no compiled module here: {accel._error}")
    return k


@pytest.fixture
def wait_env():
    k = _waiter()
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b.bind(("127.0.0.1", 0))
    bell = os.eventfd(0, os.EFD_NONBLOCK)
    lease = k.ffi.new(f"int64_t[{nicmod.LEASE_LEN}]")
    lease[3] = (1 << 63) - 1
    yield k, a, b, bell, lease
    a.close()
    b.close()
    os.close(bell)


def test_sn_wait_answers(wait_env):
    k, a, b, bell, lease = wait_env
    w = lambda timeout: k.lib.sn_wait(b.fileno(), bell, int(timeout * NS), lease,  # noqa: E731
                                      100_000, 100_000)
    assert w(0.01) == 0                               # nothing: time is up
    os.eventfd_write(bell, 1)
    assert w(5) == 2                                  # the bell
    os.eventfd_read(bell)
    a.sendto(b"x", b.getsockname())
    assert w(5) == 1                                  # a datagram, no caller holds a lease
    b.recv(16)
    lease[3] = time.monotonic_ns() + NS // 50         # the engine's deadline, 20 ms away
    t = time.monotonic()
    assert w(30) == 0 and time.monotonic() - t < 10   # woke for the deadline, not the timeout
    lease[3] = (1 << 63) - 1
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)                                      # a closed descriptor: EBADF, no crash
    assert k.lib.sn_wait(fd, bell, NS, lease, 0, 0) == -errno.EBADF


def test_sn_wait_leaves_a_datagram_to_a_caller_holding_the_lease(wait_env):
    k, a, b, bell, lease = wait_env
    a.sendto(b"x", b.getsockname())
    lease[0] = time.monotonic_ns()                    # a caller polled just now
    # lease of 10 s: the caller will take it; the thread wakes only for its timeout
    assert k.lib.sn_wait(b.fileno(), bell, NS // 20, lease, 10 * NS, 10 * NS) == 0
    # ... or for the bell, which a caller giving its lease back rings
    os.eventfd_write(bell, 1)
    assert k.lib.sn_wait(b.fileno(), bell, 5 * NS, lease, 10 * NS, 10 * NS) == 2
    os.eventfd_read(bell)
    lease[0] = 0                                      # the lease given back: the thread takes it
    assert k.lib.sn_wait(b.fileno(), bell, 5 * NS, lease, 10 * NS, 10 * NS) == 1
    b.recv(16)
    # output held: its shorter lease (hold_ns) lapses first, then the thread sends it
    lease[0] = time.monotonic_ns()
    lease[1] = 1
    assert k.lib.sn_wait(b.fileno(), bell, 5 * NS, lease, 10 * NS, NS // 100) == 3


def _voluntary_switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("voluntary_ctxt"))


def test_sn_wait_parks_longer_while_a_caller_holding_output_keeps_polling(wait_env):
    """Output held by a caller that keeps renewing its lease (a receiver coalescing
    a stream's ACKs polls all the while): the thread's parks double, up to half a
    spinner's lease, where it used to wake every hold_ns and preempt that caller.
    Once the caller stops, what it held is handed over (3) within about that."""
    k, a, b, bell, lease = wait_env
    hold, grace = 2_000_000, 200_000_000             # 2 ms, 200 ms
    lease[0] = time.monotonic_ns()
    lease[1] = 1                                     # output held
    got, tid = [], []

    def wait():
        tid.append(threading.get_native_id())
        v = _voluntary_switches(tid[0])
        got.append(k.lib.sn_wait(b.fileno(), bell, 5 * NS, lease, grace, hold))
        got.append(_voluntary_switches(tid[0]) - v)
        got.append(time.monotonic())
    t = threading.Thread(target=wait)
    t.start()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:                    # the caller polls for 300 ms
        lease[0] = time.monotonic_ns()
        time.sleep(0.0005)
    stopped = time.monotonic()
    t.join(5)
    r, wakes, returned = got
    assert r == 3                                    # the held output is the thread's now
    # parks of 2, 4, 8, ... ms up to 100 ms: about ten wakes in 300 ms (every
    # hold_ns, as before: 150)
    assert wakes < 40, wakes
    # handed over at the first look after the caller stopped: within a park
    # (half of grace) and the hold, with room for a loaded machine's scheduling
    assert returned - stopped < 0.1 + 0.4


def _cannot_raise() -> None:
    """Fail (CI, which runs as root) or skip: this process may not raise a
    thread's priority, so the NIC never raises its thread (nor lets it
    idle-park: SCHED_IDLE could not be left)."""
    why = ("this process may not raise a thread's priority (not root, "
           "no CAP_SYS_NICE or RLIMIT_NICE)")
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}: CI runs as root")
    pytest.skip(why)


def _may_raise_a_thread() -> None:
    """``_cannot_raise`` where a thread may not take a nice value below 0.  Asked
    by the test's own thread, whose nice value is then put back (Linux:
    setpriority on 0 is this thread alone)."""
    was = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -1)
    except PermissionError:
        _cannot_raise()
    os.setpriority(os.PRIO_PROCESS, 0, was)


_WORK = bytes(256 << 10)
#: tens of ms of hashing a call, without the interpreter lock: a holder that runs as a
#: C program spins, not asleep waiting for the lock (``_spin_renewing``'s reason)
_SPIN = bytes(32 << 20)


def _spin_renewing(lease, seconds: float, tid: list, seen: set) -> None:
    """A caller that polls for ``seconds``: renews the lease all the while, running
    (never asleep: the thread keeps a lease only while its holder runs), and notes
    the policies the waiting thread (``tid[0]``) is seen under.  Between renewals
    it hashes a buffer, without the interpreter lock (hashlib lets it go), as a
    C program polls without it: a thread that takes the lock meanwhile does not
    make it wait, asleep, for the lock."""
    end = time.monotonic() + seconds
    me = threading.get_native_id()
    while time.monotonic() < end:
        lease[0], lease[4] = time.monotonic_ns(), me
        hashlib.sha256(_WORK).digest()
        if tid:
            seen.add(os.sched_getscheduler(tid[0]))


def _waits_while(k, b, bell, lease, grace: int, going: threading.Event, got: list,
                 tid: list) -> None:
    """A progress thread's ``sn_wait`` for 50 ms at a time while ``going`` is set,
    each answer noted in ``got`` with the policy, nice value and lease[6] it
    returned under.  (A look that finds the caller asleep for a moment watches the
    socket until the call's end; the next call looks again.)  Its nice value is
    -1, as a raised thread's is below 0 (``_may_raise_a_thread`` asked first)."""
    os.setpriority(os.PRIO_PROCESS, 0, -1)
    tid.append(threading.get_native_id())
    while going.is_set():
        r = k.lib.sn_wait(b.fileno(), bell, NS // 20, lease, grace, grace)
        got.append((r, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), lease[6]))


@pytest.mark.parametrize("allowed", [1, 0], ids=["allowed", "not-allowed"])
def test_sn_wait_waits_out_a_spinners_renewed_lease_idle(wait_env, allowed):
    """The idle park: where lease[5] allows it, a thread that finds the lease
    renewed by a running holder look after look waits it out under SCHED_IDLE
    (lease[6]: its id meanwhile; lease[7]: counted), so its looks preempt nobody;
    where it does not, under its own policy.  Either way it returns under
    SCHED_OTHER, its nice value as it was."""
    k, a, b, bell, lease = wait_env
    _may_raise_a_thread()
    lease[5] = allowed
    grace = 2_000_000                                  # a 2 ms lease: 150 looks in 300 ms
    going, tid, got = threading.Event(), [], []
    going.set()
    t = threading.Thread(target=_waits_while, args=(k, b, bell, lease, grace, going, got, tid),
                         daemon=True)
    t.start()
    seen: set = set()
    try:
        _spin_renewing(lease, 0.3, tid, seen)
    finally:
        going.clear()
        t.join(5)
    assert not t.is_alive() and got, "sn_wait did not return"
    assert all(r == 0 for r, *_ in got)                # its timeouts: nothing arrived
    assert {(policy, nice, lowered) for _, policy, nice, lowered in got} \
        == {(os.SCHED_OTHER, -1, 0)}
    if allowed:
        assert lease[7] >= 1 and os.SCHED_IDLE in seen, (lease[7], seen)
    else:
        assert lease[7] == 0 and os.SCHED_IDLE not in seen, (lease[7], seen)


def test_unpark_idle_raises_an_idle_parked_thread_at_once(wait_env):
    """``unpark_idle`` (NIC.ring and NIC.end_lease call it) raises a thread in an
    idle park back to SCHED_OTHER before it wakes, so a ring preempts a program
    that spins on memory next; the ring then wakes it (2)."""
    k, a, b, bell, lease = wait_env
    _may_raise_a_thread()
    lease[5] = 1
    going, tid, got = threading.Event(), [], []
    going.set()
    t = threading.Thread(target=_waits_while,
                         args=(k, b, bell, lease, 20_000_000, going, got, tid), daemon=True)
    t.start()
    try:
        seen: set = set()
        end = time.monotonic() + 10
        while os.SCHED_IDLE not in seen:              # renewed, look after look (20 ms each)
            assert time.monotonic() < end and t.is_alive(), "never parked idle"
            _spin_renewing(lease, 0.005, tid, seen)
        # parked idle, for up to 20 ms, and the lease no longer renewed
        assert lease[6] == tid[0]
        nicmod.unpark_idle(lease)
        assert os.sched_getscheduler(tid[0]) == os.SCHED_OTHER
    finally:
        going.clear()
        os.eventfd_write(bell, 1)
        t.join(5)
    assert not t.is_alive() and got[-1][:2] == (2, os.SCHED_OTHER)


def test_the_thread_says_it_parks_then_looks_at_the_stamp_again(wait_env):
    """``sn_announce_park``, between the thread's look at a fresh lease and its
    park: it sets lease[2] (``end_lease`` rings only a thread that did), then
    reads the stamp again.  A lease given back after the look (the stamp lower
    than the one looked at, 0) was given back before the thread said so, and no
    ring is coming: the thread looks again (1) rather than park blind for the
    lease it read; a stamp as read, or renewed, is parked on (0)."""
    k, _, _, _, lease = wait_env
    l0 = time.monotonic_ns()
    lease[0], lease[2] = l0, 0
    assert k.lib.sn_announce_park(lease, l0) == 0 and lease[2] == 1   # parks, said so
    lease[0], lease[2] = l0 + 5, 0                    # renewed meanwhile: parks all the same
    assert k.lib.sn_announce_park(lease, l0) == 0 and lease[2] == 1
    lease[0], lease[2] = 0, 0                         # given back between the look and now
    assert k.lib.sn_announce_park(lease, l0) == 1 and lease[2] == 0   # looks again


def test_sn_wait_spin_looks_without_sleeping_then_sleeps(wait_env):
    """``sn_wait_spin``: the same answers as ``sn_wait``; for ``spin_ns`` from the
    call it looks at the socket and the bell without sleeping (the thread's own
    CPU time shows it), never past the timeout, and not while a caller holds the
    lease (the datagram is the caller's, as for ``sn_wait``).  A datagram found
    while it spins is told apart (4, not 1)."""
    k, a, b, bell, lease = wait_env
    spin = lambda timeout, s: k.lib.sn_wait_spin(b.fileno(), bell, int(timeout * NS),  # noqa
                                                 lease, 100_000, 100_000, int(s * NS))
    t, c = time.monotonic(), time.thread_time()
    assert spin(0.2, 0.1) == 0                        # spun 0.1 s, then slept to the timeout
    spun = time.thread_time() - c
    assert time.monotonic() - t >= 0.2 and spun >= 0.02
    c = time.thread_time()
    assert spin(0.1, 0) == 0                          # no spin: asleep throughout
    assert time.thread_time() - c < spun / 2
    t = time.monotonic()
    assert spin(0.05, 10) == 0 and time.monotonic() - t < 5    # the timeout ends a spin
    threading.Timer(0.02, lambda: a.sendto(b"x", b.getsockname())).start()
    assert spin(5, 1) == 4                            # a datagram lands while it spins
    b.recv(16)
    threading.Timer(0.05, lambda: a.sendto(b"x", b.getsockname())).start()
    assert spin(5, 0.005) == 1                        # ... or once it sleeps
    b.recv(16)
    threading.Timer(0.02, lambda: os.eventfd_write(bell, 1)).start()
    assert spin(5, 1) == 2                            # the bell rings while it spins
    os.eventfd_read(bell)
    a.sendto(b"x", b.getsockname())
    lease[0] = time.monotonic_ns()
    c = time.thread_time()
    assert k.lib.sn_wait_spin(b.fileno(), bell, NS // 20, lease, 10 * NS, 10 * NS, NS) == 0
    assert time.thread_time() - c < 0.02              # a caller's lease: it sleeps, no spin
    b.recv(16)


def _nics(n=2):
    cfg = RuntimeConfig(min_timer=2e-3)
    return [NIC(DeviceSpec(f"p{i}", None, 0), cfg) for i in range(n)]


def _nics_leased(monkeypatch, lease: float):
    """Two NICs with the compiled sleep and a spinner's lease of ``lease`` seconds
    (their counters not published meanwhile)."""
    _waiter()
    monkeypatch.setattr(nicmod, "STATS_EVERY", 3600.0)
    monkeypatch.setattr(nicmod, "SPIN_LEASE", lease)
    monkeypatch.setattr(nicmod, "SPIN_LEASE_NS", int(lease * 1e9))
    return _nics()


def _pair(a, b, retry_cnt=7, timeout=14):
    with a.lock, b.lock:
        ea, eb = endpoint(a.dev, buf_size=1 << 16), endpoint(b.dev, buf_size=1 << 16)
        bring_up(ea, eb, mtu=1024, timeout=timeout, retry_cnt=retry_cnt)
        bring_up(eb, ea, mtu=1024, timeout=timeout, retry_cnt=retry_cnt)
    return ea, eb


def _waiting(nic):
    """Does a datagram wait on the NIC's socket?  Looked at under its lock: the
    progress thread's steps use the same poll object."""
    with nic.lock:
        return bool(nic._readable(0))


def _until(cond, limit=10.0, spin=False):
    """Wait for ``cond()``: asleep between looks (only the threads move), or with
    ``spin`` running all the while, as a program spinning on its CQ does (the
    thread keeps a lease only while its holder runs: sn_wait)."""
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, "not within the time limit"
        if not spin:
            time.sleep(0.001)


@pytest.mark.parametrize("compiled", [True, False], ids=["sn_wait", "select.poll"])
def test_a_write_lands_while_the_program_does_not_call(compiled, monkeypatch):
    if compiled:
        _waiter()
    else:
        monkeypatch.setattr(accel, "waiter", lambda: None)
    a, b = _nics()
    try:
        ea, eb = _pair(a, b)
        for i in range(1, 21):
            ea.buf.view[0:8] = i.to_bytes(8, "little")
            a.call(a.dev.post_send, ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(0, 8)],
                                                  SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                                  rkey=eb.mr.rkey))
            _until(lambda: bytes(eb.buf.view[0:8]) == i.to_bytes(8, "little"))
        done = []
        _until(lambda: done.extend(a.call(a.dev.poll_cq, ea.send_cq, 64)) or len(done) >= 20)
        # nothing but b's thread ever stepped b: it received each WRITE, woken for it
        c = b.counters
        # (each WRITE is posted once the one before has landed: one wake-up each at least)
        assert c["rcvd_pkts"] >= 20
        assert sum(c[k] for k in nicmod._WAKES) >= 20 and c["progress_wake_datagram"] >= 1
    finally:
        a.close()
        b.close()


def test_a_lease_is_kept_while_its_holder_runs_not_while_it_sleeps_elsewhere(monkeypatch):
    """A program that polls and then sleeps elsewhere (ucx_perftest, waiting for
    its peer, polls and then sleeps in poll(2) on a socket of its own for 1 ms at
    a time) keeps no lease: the thread takes what lands at once, not when the
    lease lapses (a spinner's lease is 2 s here: the WRITE must land within a
    quarter of that), even where the thread looked while the holder still ran
    after its poll (preempted there, or working: a ring then makes it look) and
    waits the lease out: it asks again every 10 ms (wait.c's SN_REASK_NS).  One
    that keeps running after its poll (a spinner, even one the scheduler
    preempts) keeps it: what lands is left to it, and taken by the thread once
    it stopped.  The holder runs by hashing (``_SPIN``), without the interpreter
    lock: a loop of Python bytecode waits for the lock, asleep, whenever another
    thread of the process takes it, and in a full suite's process that made it
    lose its lease now and then."""
    a, b = _nics_leased(monkeypatch, 2.0)
    try:
        ea, eb = _pair(a, b, timeout=22)
        stop = threading.Event()

        def holder(sleeps):
            b.poll()                        # a fresh lease, this thread's
            b.ring()                        # the thread looks while this one runs
            end = time.monotonic() + 0.03
            while time.monotonic() < end:
                hashlib.sha256(_SPIN).digest()      # running, without the lock
            while not stop.is_set():
                if sleeps:
                    stop.wait(0.2)          # asleep elsewhere
                else:
                    hashlib.sha256(_SPIN).digest()
        for i, sleeps in ((1, True), (2, False), (3, True)):
            stop.clear()
            t = threading.Thread(target=holder, args=(sleeps,))
            t.start()
            try:
                time.sleep(0.05)
                _write(a, ea, eb, i)
                if sleeps:
                    _until(lambda: _wrote(eb, i), limit=0.5)    # taken by b's thread
                else:
                    time.sleep(0.5)
                    assert not _wrote(eb, i)                    # left to the spinner
            finally:
                stop.set()
                t.join()
            _until(lambda: _wrote(eb, i), limit=5.0)            # (the spinner's lapsed)
    finally:
        a.close()
        b.close()


def test_a_waiter_is_woken_by_the_step_that_made_its_completion():
    a, b = _nics()
    try:
        ea, eb = _pair(a, b)
        b.call(b.dev.post_recv, eb.qp, RecvWR(7, [eb.sge(0, 64)]))
        got = []

        def waiter():
            # no recheck, no timeout: only a notify can end this wait
            b.wait_until(lambda: got.extend(b.dev.poll_cq(eb.recv_cq, 4)) or bool(got))

        t = threading.Thread(target=waiter, daemon=True)
        t.start()
        time.sleep(0.05)
        assert not got
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.SEND, [ea.sge(0, 16)], SendFlags.SIGNALED))
        t.join(10)
        assert not t.is_alive() and got and got[0].wr_id == 7
    finally:
        a.close()
        b.close()


def test_an_earlier_deadline_rings_the_sleeping_thread():
    _waiter()
    (a,) = _nics(1)
    try:
        _until(lambda: a._sleep_until > time.monotonic() + 0.1)   # it sleeps (toward stats)
        rung = []
        real = a.ring
        a.ring = lambda: (rung.append(1), real())
        with a.lock:
            a._deadline(time.monotonic() + 0.01)          # earlier than its wake-up: ring
            n = len(rung)
            a._deadline(time.monotonic() + 0.5)           # later: no ring, it re-reads lease[3]
        assert n == 1 and len(rung) == 1
        _until(lambda: a.counters["progress_wake_timer"] >= 1)
    finally:
        a.close()


def test_close_wakes_the_thread_at_once():
    (a,) = _nics(1)
    t = time.monotonic()
    a.close()
    assert not a._thread.is_alive() and time.monotonic() - t < nicmod.STATS_EVERY


def test_an_icmp_error_does_not_stop_the_thread():
    """A send to a port nobody holds comes back as an ICMP port unreachable.  (On
    an unconnected socket Linux reports it only with IP_RECVERR; where it is
    reported, poll(2) says POLLERR, which sn_wait takes for a datagram: the
    receive that follows reports and clears it.)  The thread goes on either way."""
    a, b = _nics()
    try:
        ea, eb = _pair(a, b)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((a.ip, 0))
            gone = s.getsockname()
        for _ in range(3):
            with a.lock:
                a.sock.send(b"\x00" * 32, gone)
            time.sleep(0.05)
        assert a._thread.is_alive()
        eb.buf.view[0:4] = b"ping"
        b.call(b.dev.post_send, eb.qp, SendWR(1, W.RDMA_WRITE, [eb.sge(0, 4)], SendFlags.SIGNALED,
                                              remote_addr=ea.buf.addr, rkey=ea.mr.rkey))
        _until(lambda: bytes(ea.buf.view[0:4]) == b"ping")
        assert a._thread.is_alive()
    finally:
        a.close()
        b.close()


def test_sn_wait_with_a_fresh_lease_sleeps_on_the_bell_alone(wait_env):
    """While a caller's lease is fresh the thread does not watch the socket (the
    caller takes what arrives): it says it waits on the lease (lease[2]), so a
    caller giving its lease back rings it, and it returns for the bell."""
    k, a, b, bell, lease = wait_env
    lease[0] = time.monotonic_ns()
    out = []
    t = threading.Thread(target=lambda: out.append(
        k.lib.sn_wait(b.fileno(), bell, 10 * NS, lease, 10 * NS, 10 * NS)), daemon=True)
    t.start()
    _until(lambda: lease[2] == 1)
    a.sendto(b"x", b.getsockname())                   # left to the caller: no answer
    time.sleep(0.05)
    assert not out
    os.eventfd_write(bell, 1)                         # any other ring: it returns
    t.join(10)
    assert out == [2] and lease[2] == 0
    os.eventfd_read(bell)
    # end_lease (lease given back, lease[2] = 2, a ring): the thread takes the ring
    # itself and answers for the datagram the caller no longer takes
    lease[0] = time.monotonic_ns()
    out.clear()
    t = threading.Thread(target=lambda: out.append(
        k.lib.sn_wait(b.fileno(), bell, 10 * NS, lease, 10 * NS, 10 * NS)), daemon=True)
    t.start()
    _until(lambda: lease[2] == 1)
    lease[0] = 0
    lease[2] = 2
    os.eventfd_write(bell, 1)
    t.join(10)
    assert out == [1]
    with pytest.raises(BlockingIOError):
        os.eventfd_read(bell)                         # the ring was taken


def test_sn_wait_notices_a_lease_shortened_without_a_ring(wait_env):
    """A long lease (a C face's thread asleep on the socket in ibv_get_cq_event
    holds one) is shortened without a ring when that thread returns to its
    program: the parked thread looks again within a spinner's lease (grace_ns),
    not at the long lease's end, and takes the datagram nobody else will."""
    k, a, b, bell, lease = wait_env
    lease[0] = time.monotonic_ns() + 600 * NS          # ten minutes
    out = []
    t = threading.Thread(target=lambda: out.append(
        k.lib.sn_wait(b.fileno(), bell, 600 * NS, lease, NS // 20, NS // 20)), daemon=True)
    t.start()
    _until(lambda: lease[2] == 1)
    a.sendto(b"x", b.getsockname())
    time.sleep(0.2)
    assert not out                                      # the lease holder's to take
    lease[0] = time.monotonic_ns()                      # it went back to its program
    t.join(10)
    assert out == [1]


def _steps_by_thread(nic):
    """Record which thread's steps did something on ``nic``."""
    seen = []
    real = nic._step

    def step(now, inline=False, ready=False):
        did = real(now, inline, ready)
        if did:
            seen.append(threading.get_ident())
        return did
    nic._step = step
    return seen


def test_a_thread_blocked_in_wait_until_takes_its_datagram_itself():
    """The waiter sleeps on the socket in sn_wait and steps itself: the SEND that
    ends its wait is received by its own thread, not handed over by the progress
    thread."""
    _waiter()
    a, b = _nics()
    try:
        ea, eb = _pair(a, b)
        b.call(b.dev.post_recv, eb.qp, RecvWR(7, [eb.sge(0, 64)]))
        seen = _steps_by_thread(b)
        got, me = [], []

        def waiter():
            me.append(threading.get_ident())
            b.wait_until(lambda: got.extend(b.dev.poll_cq(eb.recv_cq, 4)) or bool(got))

        t = threading.Thread(target=waiter, daemon=True)
        t.start()
        _until(lambda: b._poller >= 0)
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.SEND, [ea.sge(0, 16)], SendFlags.SIGNALED))
        t.join(10)
        assert not t.is_alive() and got and got[0].wr_id == 7
        assert seen and seen[0] == me[0]
        assert b._poller == -1
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("spin", [0.5, 0.0], ids=["spin", "no-spin"])
def test_a_waiter_on_the_socket_looks_without_sleeping_first(spin, monkeypatch):
    """The waiter in ``wait_until`` (pyverbs' ``get_cq_event``) first looks at the
    socket without sleeping for ``PROGRESS_SPIN`` (``sn_wait_spin``), as C's
    ``ibv_get_cq_event`` does: a SEND that lands meanwhile is found while it spins
    (``waiter_spin_datagram``).  With the spin off it sleeps at once, and finds
    none so."""
    _waiter()
    monkeypatch.setattr(nicmod, "PROGRESS_SPIN_NS", int(spin * 1e9))
    a, b = _nics()
    try:
        ea, eb = _pair(a, b)
        b.call(b.dev.post_recv, eb.qp, RecvWR(7, [eb.sge(0, 64)]))
        got = []
        t = threading.Thread(target=lambda: b.wait_until(
            lambda: got.extend(b.dev.poll_cq(eb.recv_cq, 4)) or bool(got)), daemon=True)
        t.start()
        _until(lambda: b._poller >= 0)
        time.sleep(0.01)
        a.call(a.dev.post_send, ea.qp, SendWR(1, W.SEND, [ea.sge(0, 16)], SendFlags.SIGNALED))
        t.join(10)
        assert not t.is_alive() and got and got[0].wr_id == 7
        assert b.counters["waiter_spin_datagram"] == (1 if spin else 0), b.counters
    finally:
        a.close()
        b.close()


def test_two_waiters_and_a_timer_while_one_sleeps_on_the_socket():
    """One waiter sleeps on the socket, a second on the condition: each is woken by
    the step that made its completion.  Then the peer is gone: the retransmission
    timer (the progress thread's) still fires while a thread waits, and the
    error completion ends the wait."""
    _waiter()
    a, b = _nics()
    try:
        ea, eb = _pair(a, b, retry_cnt=2)
        for i in (1, 2):
            b.call(b.dev.post_recv, eb.qp, RecvWR(i, [eb.sge(64 * i, 64)]))
        got: list = []
        done = {1: False, 2: False}

        def waiter(k):
            def pred():
                got.extend(b.dev.poll_cq(eb.recv_cq, 4))
                return any(w.wr_id == k for w in got)
            done[k] = b.wait_until(pred, timeout=20)

        ts = [threading.Thread(target=waiter, args=(k,), daemon=True) for k in (1, 2)]
        for t in ts:
            t.start()
        _until(lambda: b._waiters == 2)
        for i in (1, 2):
            a.call(a.dev.post_send, ea.qp, SendWR(i, W.SEND, [ea.sge(0, 16)],
                                                  SendFlags.SIGNALED))
        for t in ts:
            t.join(15)
        assert done == {1: True, 2: True}
        sent: list = []
        _until(lambda: sent.extend(a.call(a.dev.poll_cq, ea.send_cq, 4)) or len(sent) >= 2)
        b.close()                                         # the peer goes away
        a.call(a.dev.post_send, ea.qp, SendWR(3, W.SEND, [ea.sge(0, 16)], SendFlags.SIGNALED))
        err: list = []
        assert a.wait_until(lambda: err.extend(a.dev.poll_cq(ea.send_cq, 4)) or bool(err),
                            timeout=30)
        assert err[0].wr_id == 3 and err[0].status != 0   # retries exhausted
    finally:
        a.close()
        b.close()


def test_close_ends_a_wait_on_the_socket():
    _waiter()
    (a,) = _nics(1)
    out = []
    t = threading.Thread(target=lambda: out.append(a.wait_until(lambda: False)), daemon=True)
    t.start()
    _until(lambda: a._poller >= 0)
    a.close()
    t.join(10)
    assert out == [False]


def test_the_tcp_thread_sleeps_until_there_is_work():
    """The iWARP NIC's thread sleeps in one select on its connections and the bell:
    idle, it wakes for the counters' publication only (once a second), not on a
    timed nap; a connection a verbs call opens is rung for."""
    from softnic.driver.nic import TcpNIC
    a = TcpNIC(DeviceSpec("t0", None, 0), RuntimeConfig())
    try:
        _until(lambda: a._sleep_until > time.monotonic())   # asleep
        time.sleep(0.5)
        assert sum(a._wakes) <= 2, a._wakes               # (a 50 ms nap: 10)
        rung = []
        real = a.ring
        a.ring = lambda: (rung.append(1), real())
        with socket.create_server((a.ip, 0)) as ls:
            a.call(a.sock.connect, 99, ls.getsockname())
            assert rung                                   # a new connection to watch
    finally:
        a.close()


def test_the_c_face_gives_its_lease_back_only_at_its_last_completion():
    """ibv_poll_cq gives the caller's lease back (NIC.end_lease) when the QPs of
    what it returned have nothing more outstanding (a latency test spins on memory
    next), and keeps it while sends are in flight or receives posted (a bandwidth
    test or UCX polls again at once: its inline steps take what arrives)."""
    from softnic.experiments.rig import connect
    from softnic.core.device import Device
    from softnic.faces.libibverbs.backend import _more_to_complete
    a, b = Device("a", "10.0.0.1"), Device("b", "10.0.0.2")
    ea, eb = connect(a, b, mtu=1024)
    for i in (1, 2):
        a.post_send(ea.qp, SendWR(i, W.RDMA_WRITE, [ea.sge(0, 8)], SendFlags.SIGNALED,
                                  remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    first, second = a.datagrams_to_send(0.0)
    b.receive_datagram(first[0], a.address, 0.0)
    for d, _ in b.datagrams_to_send(0.0):
        a.receive_datagram(d, b.address, 0.0)
    got = a.poll_cq(ea.send_cq, 8)
    assert [w.wr_id for w in got] == [1]
    assert _more_to_complete(a, got)            # the second is still in flight
    b.receive_datagram(second[0], a.address, 0.0)
    for d, _ in b.datagrams_to_send(0.0):
        a.receive_datagram(d, b.address, 0.0)
    got = a.poll_cq(ea.send_cq, 8)
    assert [w.wr_id for w in got] == [2]
    assert not _more_to_complete(a, got)        # nothing outstanding: give the lease back
    # a receive posted may complete without a new post (a SEND arriving: UCX, an
    # RPC server): the caller polls again, and keeps its lease
    a.post_recv(ea.qp, RecvWR(9, [ea.sge(0, 64)]))
    assert _more_to_complete(a, got)


def test_the_c_face_gives_its_lease_back_when_its_cq_is_armed():
    """A program that arms its CQ (ibv_req_notify_cq) waits on the channel next
    (ibv_get_cq_event): its poll gives the lease back, so the progress thread
    takes the datagram that makes the next completion at once, instead of leaving
    it to a caller that polls no more.  Unarmed, an empty poll keeps (renews) it."""
    from softnic.faces.libibverbs import backend
    (a,) = _nics(1)
    try:
        with a.lock:
            cq = a.dev.create_cq(16)
        h = backend._new(backend._Obj(a, cq))
        try:
            assert backend.sn_poll_cq(h, 4, None, 0) == 0
            assert a._lease[0] != 0                   # a spinning caller's lease
            with a.lock:
                cq.req_notify(False)
            assert backend.sn_poll_cq(h, 4, None, 0) == 0
            assert a._lease[0] == 0                   # given back: the thread takes over
        finally:
            del backend._objs[h]
    finally:
        a.close()


def test_owes_acks_only_is_plain_acks_and_nothing_else():
    """Device.owes_acks_only: true while all the device would send is plain ACKs of
    requests it received (what a driver may hold for the program's next post);
    false with a request to send, a READ response to send, or nothing at all."""
    from softnic.experiments.rig import connect
    from softnic.core.device import Device
    a, b = Device("a", "10.0.0.1"), Device("b", "10.0.0.2")
    ea, eb = connect(a, b, mtu=1024)
    assert not b.owes_acks_only()                                   # nothing owed
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, 8)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    assert not a.owes_acks_only()                                   # a request to send
    for d, _ in a.datagrams_to_send(0.0):
        b.receive_datagram(d, a.address, 0.0)
    assert b.owes_acks_only()                                       # the WRITE's ACK
    b.post_send(eb.qp, SendWR(2, W.RDMA_WRITE, [eb.sge(0, 8)], SendFlags.SIGNALED,
                              remote_addr=ea.buf.addr, rkey=ea.mr.rkey))
    assert not b.owes_acks_only()                                   # ... and a request
    out = b.datagrams_to_send(0.0)
    assert len(out) == 2 and len(out[1][0]) < len(out[0][0])        # the request first
    a.post_send(ea.qp, SendWR(3, W.RDMA_READ, [ea.sge(0, 8)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    for d, _ in a.datagrams_to_send(0.0):
        b.receive_datagram(d, a.address, 0.0)
    assert not b.owes_acks_only()                                   # a READ response


def _wrote(ep, i):
    return bytes(ep.buf.view[0:8]) == i.to_bytes(8, "little")


def _write(nic, ep, peer, i):
    ep.buf.view[0:8] = i.to_bytes(8, "little")
    nic.call(nic.dev.post_send, ep.qp, SendWR(i, W.RDMA_WRITE, [ep.sge(0, 8)],
                                              SendFlags.SIGNALED, remote_addr=peer.buf.addr,
                                              rkey=peer.mr.rkey))


def test_the_ack_of_a_write_waits_for_the_answer_that_carries_it(monkeypatch):
    """A program that spins on memory after its last completion (end_lease with
    ``answering``: perftest's WRITE latency test) answers the WRITE that lands
    with one of its own.  The progress thread that lands it holds its ACK for
    that post, which carries it out behind its WRITE; the peer, polling for the
    ACK, takes the WRITE inline first, and an inline step that then receives the
    ACK keeps holding the ACK it owes (it answers next).  Without an answer the
    held ACK still leaves (HOLD_LEASE)."""
    _waiter()
    monkeypatch.setattr(nicmod, "HOLD_LEASE", 5.0)      # held until the post, here
    monkeypatch.setattr(nicmod, "STATS_EVERY", 3600.0)  # (no wake-up to publish counters,
    a, b = _nics()                                       # whose step would send it early)
    try:
        ea, eb = _pair(a, b, timeout=22)                 # (no retransmission meanwhile: 17 s)
        b.end_lease(answering=True)                      # b spins on memory
        _write(a, ea, eb, 1)
        _until(lambda: _wrote(eb, 1))                    # b's thread landed it ...
        with b.lock:
            assert b._owed                               # ... and holds its ACK
        with a.lock:
            a._lease[0] = time.monotonic_ns() + 60 * NS  # a polls (its thread stays off)
        time.sleep(0.05)
        assert not _waiting(a)                           # the ACK has not left
        _write(b, eb, ea, 2)                             # b's answer carries it out
        _until(lambda: _waiting(a))
        time.sleep(0.05)
        a.poll()                                         # a takes b's WRITE first ...
        assert _wrote(ea, 2) and a._owed
        got = []
        a.poll()                                         # ... then the ACK of its own
        with a.lock:
            got.extend(a.dev.poll_cq(ea.send_cq, 4))
            assert [w.wr_id for w in got] == [1]
            assert a._owed and a.dev.owes_acks_only()    # and still holds b's ACK
        time.sleep(0.05)
        assert not _waiting(b)
        a.end_lease(answering=True)
        _write(a, ea, eb, 3)                             # carried out by a's answer
        done = []
        _until(lambda: done.extend(b.call(b.dev.poll_cq, eb.send_cq, 4)) or bool(done))
        assert [w.wr_id for w in done] == [2]
    finally:
        a.close()
        b.close()


def _send(nic, ep, i):
    """SEND ``i``: 8 bytes of ``i`` from the start of ``ep``'s buffer."""
    ep.buf.view[0:8] = i.to_bytes(8, "little")
    nic.call(nic.dev.post_send, ep.qp, SendWR(i, W.SEND, [ep.sge(0, 8)], SendFlags.SIGNALED))


def _received(nic, ep):
    """The wr_ids of the receive completions ``ep`` has, taken."""
    with nic.lock:
        return [w.wr_id for w in nic.dev.poll_cq(ep.recv_cq, 8)]


@pytest.mark.parametrize("answers", [True, False], ids=["answers", "does-not-answer"])
def test_the_ack_of_a_send_that_wakes_a_sleeper_waits_for_its_answer(monkeypatch, answers):
    """A program that arms its CQ and sleeps on the channel's fd itself
    (``end_lease_to_sleep``: UCX's ``ucp_worker_wait``) wakes to the SEND that
    lands and answers it.  The progress thread that takes the SEND holds its
    ACK until a deadline (lease[1]); the program's poll after the wake finds the
    completion and nothing to receive, and leaves the ACK held; its answer
    carries the ACK out behind its SEND, one flush for both, so the peer (asleep
    too, in UCX's ping-pong) wakes once for them.  A program that does not
    answer has the ACK sent by its first poll after the deadline."""
    _waiter()
    hold = 5.0 if answers else 0.2
    monkeypatch.setattr(nicmod, "HOLD_LEASE", hold)
    monkeypatch.setattr(nicmod, "STATS_EVERY", 3600.0)  # (no wake-up to publish counters)
    a, b = _nics()
    try:
        ea, eb = _pair(a, b, timeout=22)                 # (no retransmission meanwhile: 17 s)
        for nic, ep in ((a, ea), (b, eb)):
            nic.call(nic.dev.post_recv, ep.qp, RecvWR(9, [ep.sge(64, 64)]))
        with a.lock:
            a._lease[0] = time.monotonic_ns() + 60 * NS  # a polls (its thread stays off)
        b.end_lease_to_sleep()                           # b armed its CQ and sleeps
        _send(a, ea, 1)
        _until(lambda: len(eb.recv_cq.entries) == 1)     # b's thread took the SEND ...
        with b.lock:
            assert b._owed and b._lease[1] > 1           # ... and holds its ACK
            deadline = b._lease[1]
        time.sleep(0.05)
        assert not _waiting(a)
        b.poll()                                         # woken, b polls first
        assert _received(b, eb) == [9]
        assert b._owed and not _waiting(a)               # the ACK still held
        if answers:
            sent = b.counters["sent_pkts"]
            _send(b, eb, 2)                              # b's answer carries it out
            assert b.counters["sent_pkts"] == sent + 2
            _until(lambda: _waiting(a))
            a.poll()                                     # one receive: b's SEND first
            assert _received(a, ea) == [9]
            with a.lock:
                assert a.dev.poll_cq(ea.send_cq, 4) == []
            a.poll()                                     # then the ACK of a's own
            with a.lock:
                assert [w.wr_id for w in a.dev.poll_cq(ea.send_cq, 4)] == [1]
        else:
            end = time.monotonic() + 10
            while not _waiting(a):                       # b polls on, answering nothing
                assert time.monotonic() < end, "the held ACK never left"
                b.poll()
            assert time.monotonic_ns() >= deadline       # not before the deadline
            a.poll()
            with a.lock:
                assert [w.wr_id for w in a.dev.poll_cq(ea.send_cq, 4)] == [1]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("armed, seen", [(False, 0), (False, 1), (True, 0)],
                         ids=["polling", "polling, seen", "armed"])
def test_the_c_face_poll_takes_the_ack_behind_the_peers_write(monkeypatch, armed, seen):
    """ib_write_lat's turn on the C face: the peer's WRITE lands just ahead of the
    ACK the program polls for (the WRITE carried it out), and the program reacts
    to completions only.  One ``ibv_poll_cq`` takes both (``POLL_RUNS``): the
    WRITE is placed and the completion comes back in that call.  A program whose
    CQ is armed sleeps on its channel next: its poll takes one receive.  (The
    socket is looked at under the NIC's lock: ``_waiting``.)  ``seen``: shim.c's
    ``poll(2)`` saw the datagrams before it entered Python, and ``NIC.poll``
    does not ask the socket again (it does without it)."""
    from softnic.faces.libibverbs import backend, build
    _waiter()
    ffi = build.LIBRARY.records_ffi()
    monkeypatch.setattr(backend.extern, "ffi", ffi)     # (as install() sets them)
    monkeypatch.setattr(backend, "_wc", backend._wc_struct(ffi))
    monkeypatch.setattr(nicmod, "HOLD_LEASE", 5.0)      # the ACK leaves with the answer
    monkeypatch.setattr(nicmod, "STATS_EVERY", 3600.0)
    a, b = _nics()
    try:
        ea, eb = _pair(a, b, timeout=22)
        b.end_lease(answering=True)                      # b spins on memory
        _write(a, ea, eb, 1)
        _until(lambda: _wrote(eb, 1))                    # landed; its ACK held for b's post
        with a.lock:
            a._lease[0] = time.monotonic_ns() + 60 * NS  # a polls (its thread stays off)
        time.sleep(0.05)                                 # (a's thread back asleep)
        _write(b, eb, ea, 2)                             # b's WRITE, then a's ACK behind it
        _until(lambda: _waiting(a))
        time.sleep(0.05)                                 # (both wait on a's socket)
        h = backend._new(backend._Obj(a, ea.send_cq))
        try:
            if armed:
                with a.lock:
                    ea.send_cq.req_notify(False)
            out = ffi.new("struct sn_wc[4]")
            asked = []                                   # who asked the socket
            readable = a._readable
            monkeypatch.setattr(a, "_readable", lambda t: (
                asked.append(sys._getframe(1).f_code.co_name), readable(t))[1])
            got = backend.sn_poll_cq(h, 4, out, seen)
            assert ("poll" in asked) == (not seen)
            assert _wrote(ea, 2)                         # b's WRITE landed first
            if armed:
                assert got == 0                          # one receive: the WRITE (the
                # poll then gives the lease back: the thread takes the ACK)
            else:
                assert got == 1 and out[0].wr_id == 1    # the WRITE and the ACK, one call
                assert not _waiting(a)
        finally:
            del backend._objs[h]
    finally:
        a.close()
        b.close()


def test_end_lease_rings_the_thread_only_where_it_took_something_last_time(monkeypatch):
    """A program that gives its lease back with nothing more to complete
    (``end_lease(answering=True)``) wakes a thread waiting out that lease only
    if, after its previous such call, the thread took a datagram before the
    program's next call (perftest's WRITE latency test: the peer's WRITE lands
    while the program spins on memory).  A program that posts next (the READ
    latency test, whose response its own poll takes) costs no wake-up; the
    thread then looks when the lease would have lapsed, and a WRITE that lands
    meanwhile is taken and rings it the next time."""
    a, b = _nics_leased(monkeypatch, 0.05)
    rings = []
    try:
        ea, eb = _pair(a, b, timeout=22)
        ring = b.ring
        monkeypatch.setattr(b, "ring", lambda: (rings.append(1), ring()))

        def rung():
            return bool(select.select([b._bell], [], [], 0)[0])

        def parked():
            b.poll()                                     # a fresh lease ...
            os.eventfd_write(b._bell, 1)                 # ... the thread looks at it
            # and waits it out: parked with the bell read, so not a park the thread
            # entered before this ring, which the ring is about to end (the ring
            # of the last end_lease may still be in flight when the lease is renewed)
            _until(lambda: not rung() and b._lease[2] == 1, spin=True)

        parked()
        b.end_lease(answering=True)
        assert len(rings) == 1                           # the first time: rung
        parked()
        b.end_lease(answering=True)
        assert len(rings) == 1                           # nothing came between
        _write(a, ea, eb, 1)                             # b spins on memory: a WRITE
        _until(lambda: _wrote(eb, 1))                    # taken once the lease lapsed
        parked()
        b.end_lease(answering=True)
        assert len(rings) == 2                           # so rung again
        parked()
        b.end_lease(answering=False)                     # (a CQ armed: always rung)
        assert len(rings) == 3
    finally:
        a.close()
        b.close()


def test_a_held_ack_leaves_without_an_answer(monkeypatch):
    _waiter()
    monkeypatch.setattr(nicmod, "HOLD_LEASE", 0.02)
    a, b = _nics()
    try:
        ea, eb = _pair(a, b)
        b.end_lease(answering=True)
        _write(a, ea, eb, 1)
        _until(lambda: _wrote(eb, 1))
        done = []                                        # b never calls: its thread sends it
        _until(lambda: done.extend(a.call(a.dev.poll_cq, ea.send_cq, 4)) or bool(done))
        assert [w.wr_id for w in done] == [1]
        assert b.counters["progress_wake_held"] >= 1
    finally:
        a.close()
        b.close()


def _write_n(nic, ep, peer, i):
    """WRITE ``i``: 8 * ``i`` bytes of ``i`` to offset 64 * ``i`` of the peer's buffer.
    Each a little longer than the last, so that GRO leaves them apart (a run of
    coalesced datagrams is of one size, its last one at most shorter)."""
    n = 8 * i
    ep.buf.view[0:n] = bytes([i]) * n
    nic.call(nic.dev.post_send, ep.qp, SendWR(i, W.RDMA_WRITE, [ep.sge(0, n)],
                                              SendFlags.SIGNALED,
                                              remote_addr=peer.buf.addr + 64 * i,
                                              rkey=peer.mr.rkey))


def _landed(ep, i):
    return bytes(ep.buf.view[64 * i:64 * i + 8 * i]) == bytes([i]) * (8 * i)


def _nics_holding(monkeypatch):
    """Two NICs with the compiled sleep whose held output may wait 5 s
    (``HOLD_LEASE``: a test's own steps decide when it leaves), their counters
    not published meanwhile."""
    _waiter()
    monkeypatch.setattr(nicmod, "HOLD_LEASE", 5.0)
    monkeypatch.setattr(nicmod, "STATS_EVERY", 3600.0)
    return _nics()


def _four_writes_wait(a, b, ea, eb) -> int:
    """a polls (its thread stays off) with its ACK mark at three packets, and b's
    WRITEs 1-4 (``_write_n``) wait on a's socket; b's count of packets received
    then."""
    a._ack_pkts = 3
    a._lease[0] = time.monotonic_ns() + 60 * NS
    for i in (1, 2, 3, 4):
        _write_n(b, eb, ea, i)
    time.sleep(0.05)
    return b.counters["rcvd_pkts"]


def _four_writes_acked_twice(b, ea, eb, rcvd: int) -> None:
    """The four landed, b completes them in order, and two ACKs came back for them
    (``rcvd``: b's count before a took them)."""
    assert all(_landed(ea, i) for i in (1, 2, 3, 4))
    done = []
    _until(lambda: done.extend(b.call(b.dev.poll_cq, eb.send_cq, 8)) or len(done) >= 4)
    assert [w.wr_id for w in done] == [1, 2, 3, 4]
    assert b.counters["rcvd_pkts"] == rcvd + 2


def test_a_polling_receiver_of_a_stream_coalesces_its_acks_up_to_half_a_window(monkeypatch):
    """An inline step keeps holding ACKs across a step that receives only a
    response (the ACK of the caller's own request: it answers next), and across
    steps that receive further requests while they number fewer than half a
    window (``_ack_pkts``) since output last left and more wait: one ACK then
    acknowledges them all, as the progress thread's coalesced ACKs do.  At the
    mark they go (a sender streaming to a program that polls, UCX's progress
    loop, would otherwise run out of window), and so they do at a step after
    which nothing waits."""
    a, b = _nics_holding(monkeypatch)
    try:
        ea, eb = _pair(a, b, timeout=22)
        assert a._ack_pkts == a.dev.config.window // 2
        with a.lock:
            rcvd = _four_writes_wait(a, b, ea, eb)
            seen = []
            for i in (1, 2, 3, 4, 5):
                a.poll()                                 # one datagram a step
                seen.append((a.counters["rcvd_pkts"], a._owed, a.counters["sent_pkts"]))
        # held after the first, the second (two, and more wait); sent with the
        # third (the mark); the fourth held; sent by the step after which none waits
        assert seen == [(1, True, 0), (2, True, 0), (3, False, 1), (4, True, 1),
                        (4, False, 2)]
        _four_writes_acked_twice(b, ea, eb, rcvd)
    finally:
        a.close()
        b.close()


def test_one_inline_step_of_many_runs_sends_its_acks_at_the_mark(monkeypatch):
    """An inline step that takes several receives (the C face's ``ibv_poll_cq``:
    ``runs`` 16) sends the ACKs it holds once half a window of packets has come
    since output last left (``_ack_pkts``), as steps of one receive each do
    across calls, not only after its last receive: eight runs of 64 KiB WRITEs
    are a whole window, and a sender waiting for their ACK stalls.  What it
    takes after the mark is held as before."""
    a, b = _nics_holding(monkeypatch)
    try:
        ea, eb = _pair(a, b, timeout=22)
        with a.lock:
            rcvd = _four_writes_wait(a, b, ea, eb)
            a.poll(8)
            # the ACK of the first three went at the mark, the fourth's is held
            assert (a.counters["rcvd_pkts"], a.counters["sent_pkts"], a._owed) == (4, 1, True)
            assert a._rx_held == 1
        _four_writes_acked_twice(b, ea, eb, rcvd)
    finally:
        a.close()
        b.close()


def test_the_thread_is_raised_only_while_the_program_drives_the_device(monkeypatch):
    """The progress thread takes PROGRESS_NICE while the program drives the device
    (a poll, or end_lease before it spins on memory, raises it) and its own nice
    value again, when it wakes, once PROGRESS_NICE_HOLD has passed without either.
    The passive side of one-sided traffic, which does neither, lands WRITEs at the
    nice value it started with (raised, it would preempt the sender at each
    message: docs/performance.md, "Many QPs")."""
    _waiter()
    monkeypatch.setattr(nicmod, "PROGRESS_NICE", -10)
    monkeypatch.setattr(nicmod, "PROGRESS_NICE_HOLD", 0.2)
    a, b = _nics()
    try:
        tid = b._thread.native_id
        nice = lambda: os.getpriority(os.PRIO_PROCESS, tid)    # noqa: E731
        base = nice()
        ea, eb = _pair(a, b)
        for i in range(1, 6):
            _write(a, ea, eb, i)
            _until(lambda: _wrote(eb, i))                     # b's thread landed it
        assert b.counters["progress_wake_datagram"] >= 1
        assert nice() == base and b.counters["progress_nice_changes"] == 0
        b.poll()                                               # b polls
        if b._raised is None:
            _cannot_raise()
        assert nice() == -10 and b.counters["progress_nice_changes"] == 1
        time.sleep(0.3)                                        # no call for the hold
        _write(a, ea, eb, 7)
        _until(lambda: nice() == base)
        assert b.counters["progress_nice_changes"] == 2
        b.end_lease(answering=True)                            # b spins on memory
        assert nice() == -10 and b.counters["progress_nice_changes"] == 3
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("idle", [True, False], ids=["idle-park", "no-idle-park"])
def test_a_raised_thread_idle_parks_beside_a_program_that_keeps_polling(idle, monkeypatch):
    """A program that keeps polling (a spinner's inline steps) while the thread is
    raised: the thread waits out its lease in idle parks (``IDLE_PARK``; counted,
    ``progress_idle_parks``), and the program giving its lease back (end_lease)
    raises it at once, before it runs.  ``SOFTNIC_IDLE_PARK=0``: none."""
    _waiter()
    monkeypatch.setattr(nicmod, "PROGRESS_NICE", -10)
    monkeypatch.setattr(nicmod, "IDLE_PARK", idle)
    monkeypatch.setattr(nicmod, "SPIN_LEASE", 0.002)
    monkeypatch.setattr(nicmod, "SPIN_LEASE_NS", 2_000_000)
    a, b = _nics()
    try:
        tid = a._thread.native_id
        a.poll()
        if a._raised is None:
            _cannot_raise()
        seen = set()
        end = time.monotonic() + (5.0 if idle else 0.2)
        while time.monotonic() < end and os.SCHED_IDLE not in seen:
            a.poll()                                   # the program spins on its CQ
            seen.add(os.sched_getscheduler(tid))
        if idle:
            assert os.SCHED_IDLE in seen and a.counters["progress_idle_parks"] >= 1
            a.end_lease()                              # the program spins on memory next
            assert os.sched_getscheduler(tid) == os.SCHED_OTHER
            assert os.getpriority(os.PRIO_PROCESS, tid) == -10
        else:
            assert os.SCHED_IDLE not in seen and a.counters["progress_idle_parks"] == 0
    finally:
        a.close()
        b.close()


def _reads(a, ea, eb, n):
    """``n`` 8-byte READs from a, one at a time.  a's program drives its device (it
    polls once before each post) but then sleeps between looks at its CQ, so a's
    thread takes the responses.  (A poll after the post would race b's answer: a
    spinning b answers within it about half the time, and nearly always on a
    loaded machine.)"""
    for i in range(n):
        a.poll()
        a.call(a.dev.post_send, ea.qp, SendWR(i, W.RDMA_READ, [ea.sge(0, 8)], SendFlags.SIGNALED,
                                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
        got = []
        end = time.monotonic() + 10
        while not got:
            assert time.monotonic() < end, "no completion"
            time.sleep(0.0005)
            got = a.call(a.dev.poll_cq, ea.send_cq, 4)
        assert got[0].status == 0


@pytest.mark.parametrize("spin", [0.05, 0.0], ids=["spin", "no-spin"])
def test_the_passive_side_of_reads_spins_the_side_that_polls_does_not(spin, monkeypatch):
    """b's program never calls softnic: its thread answers each READ, and after a
    step that took a packet or two it spins (``PROGRESS_SPIN``) rather than sleep,
    so the next READ finds it spinning.  a's thread takes each response, but a's
    program drives its device (it polled within ``PROGRESS_NICE_HOLD``), so a's
    thread sleeps, never spinning beside it.  With the spin off, b's thread finds
    nothing while spinning."""
    _waiter()
    monkeypatch.setattr(nicmod, "PROGRESS_SPIN", spin)
    a, b = _nics()
    try:
        ea, eb = _pair(a, b)
        _reads(a, ea, eb, 40)
        found = b.counters["progress_spin_datagram"]
        if spin:
            assert found >= 20, b.counters
        else:
            assert found == 0
        # a's thread took the responses, sleeping until each arrived
        assert a.counters["progress_wake_datagram"] >= 30, a.counters
        assert a.counters["progress_spin_datagram"] == 0
    finally:
        a.close()
        b.close()


def test_a_poll_takes_a_reads_burst_in_one_call_and_stops_at_a_request():
    """``NIC.poll(runs, reads=True)`` (pyverbs' CQ poll): a READ's FIRST, MIDDLE and
    LAST waiting on the socket are taken in one call, which then holds the READ's
    completion.  Without ``reads`` one receive takes the FIRST alone, unless the
    kernel streams the MIDDLEs after it (``_rx_stream``: then the MIDDLE and the
    LAST that stops the stream too).  Two WRITEs of the peer's waiting: the call
    takes the first and leaves the second (a program may spin on memory for a
    request).  The test holds a's lock throughout, so a's progress thread (woken
    by the bell a new timer rings) cannot take them first."""
    _waiter()
    a, b = _nics()
    stream = a._stream
    assert stream is not None
    try:
        ea, eb = _pair(a, b, timeout=20)
        eb.buf.view[0:3000] = bytes(range(250)) * 12
        for reads, streams in ((False, False), (False, True), (True, False)):
            a._stream = stream if streams else None
            with a.lock:
                sent = b.counters["sent_pkts"]
                a.call(a.dev.post_send, ea.qp, SendWR(1, W.RDMA_READ, [ea.sge(0, 3000)],
                                                      SendFlags.SIGNALED,
                                                      remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
                _until(lambda: b.counters["sent_pkts"] >= sent + 3)
                time.sleep(0.05)                          # the three on a's socket
                before = a.counters["rcvd_pkts"]
                if reads:
                    a.poll(4, reads=True)
                else:
                    a.poll()                              # one receive
                took = a.counters["rcvd_pkts"] - before
                got = a.call(a.dev.poll_cq, ea.send_cq, 4)
            if reads or streams:
                assert took == 3 and len(got) == 1 and got[0].status == 0
                assert bytes(ea.buf.view[0:3000]) == bytes(eb.buf.view[0:3000])
            else:
                assert took == 1 and got == []
                _until(lambda: a.poll() or a.call(a.dev.poll_cq, ea.send_cq, 4))
        a._stream = stream
        with a.lock:
            sent = b.counters["sent_pkts"]
            for n in (8, 16):         # two WRITEs of b's into a (of two sizes: two receives)
                b.call(b.dev.post_send, eb.qp, SendWR(n, W.RDMA_WRITE, [eb.sge(0, n)],
                                                      SendFlags.SIGNALED, remote_addr=ea.buf.addr,
                                                      rkey=ea.mr.rkey))
            _until(lambda: b.counters["sent_pkts"] >= sent + 2)
            time.sleep(0.05)
            before = a.counters["rcvd_pkts"]
            a.poll(4, reads=True)
            assert a.counters["rcvd_pkts"] - before == 1
        _until(lambda: a.poll() or a.counters["rcvd_pkts"] - before == 2)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("mark, own", [(1, False), (64, False), (64, True)],
                         ids=["at_the_mark", "below_it", "below_it_with_a_request_out"])
def test_a_receive_posted_sends_output_held_for_the_call_and_nothing_else(mark, own):
    """``NIC.post_recv`` leaves out the flush (a receive makes no datagram) but not
    the output an inline step held for the caller's next call once it may wait
    no longer: the ACK of a WRITE that b's poll took leaves with b's next post of
    a receive when that WRITE reached half a window (``_ack_pkts``), or when b
    has a request of its own outstanding on the QP (``own``: one side of a
    ping-pong, whose peer waits for that ACK); else, while another WRITE waits,
    the ACK stays held (the receiver of a stream of SENDs reposts one receive
    per message: their ACKs coalesce), and b's step that takes the last sends
    it."""
    _waiter()
    a, b = _nics()
    try:
        ea, eb = _pair(a, b)
        b._ack_pkts = mark
        b.lock.acquire()              # b's progress thread cannot step meanwhile
        if own:
            a.lock.acquire()          # ... nor a's, which would ACK b's WRITE
            b.call(b.dev.post_send, eb.qp, SendWR(9, W.RDMA_WRITE, [eb.sge(0, 8)],
                                                  SendFlags.SIGNALED,
                                                  remote_addr=ea.buf.addr, rkey=ea.mr.rkey))
        b.poll()
        sent = b.counters["sent_pkts"]
        b.post_recv(b.dev.post_recv, eb.qp, RecvWR(1, [eb.sge(0, 64)]))
        assert b.counters["sent_pkts"] == sent and not b._owed     # nothing to send
        _write_n(a, ea, eb, 1)
        _write_n(a, ea, eb, 2)
        time.sleep(0.05)
        b.poll()                                          # takes a WRITE, holds its ACK
        assert b.counters["rcvd_pkts"] == 1 and b._owed
        assert b.counters["sent_pkts"] == sent
        b.post_recv(b.dev.post_recv, eb.qp, RecvWR(2, [eb.sge(64, 64)]))
        if mark > 1 and not own:
            assert b.counters["sent_pkts"] == sent and b._owed   # the other waits
            b.poll()                                      # takes it: none waits
            assert b.counters["rcvd_pkts"] == 2
        assert b.counters["sent_pkts"] == sent + 1 and not b._owed
        b.lock.release()
        if own:
            a.lock.release()
    finally:
        a.close()
        b.close()


def test_a_poll_sends_what_its_posts_held_before_it_receives(monkeypatch):
    """Requests the caller's posts held for its next call (``NIC.post``: its lease
    fresh, a send of the QP's outstanding) leave before that call's inline step
    receives: the peer, who posted its own fragments and polls for ours (an
    allreduce's exchange), is not kept waiting by our receive of its fragments.
    a holds two WRITEs while three of b's wait on its socket; a's poll hands
    both WRITEs to the socket before its first receive, then takes b's three
    (``runs`` 8 here), and b's WRITEs and a's land."""
    a, b = _nics_holding(monkeypatch)
    try:
        ea, eb = _pair(a, b, timeout=22)
        with a.lock:
            a._lease[0] = time.monotonic_ns() + 60 * NS   # a polls (its thread stays off)

            def post(i):
                n, at = 8 * i, 4096 + 64 * i           # (its own source: read when built)
                ea.buf.view[at:at + n] = bytes([i]) * n
                a.post(ea.qp.qpn, a.dev.post_send, ea.qp,
                       SendWR(i, W.RDMA_WRITE, [ea.sge(at, n)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr + 64 * i, rkey=eb.mr.rkey))
            b_rcvd = b.counters["rcvd_pkts"]
            post(1)                                      # nothing outstanding: sent at once
            assert not a._posts_owed
            post(2)
            post(3)                                      # held for a's next call
            assert a._posts_owed and a._owed and a.counters["posts_held"] == 2
            for i in (4, 5, 6):
                _write_n(b, eb, ea, i)
            time.sleep(0.05)                             # b's three wait on a's socket
            assert b.counters["rcvd_pkts"] == b_rcvd + 1     # (WRITE 1 only)
            order = []
            for name in ("send", "send_runs", "send_batch"):
                fn = getattr(a.sock, name)
                monkeypatch.setattr(a.sock, name,
                                    lambda *args, fn=fn: order.append("send") or fn(*args))
            for name in ("receive_run", "receive_datagram"):
                fn = getattr(a.dev, name)
                monkeypatch.setattr(a.dev, name,
                                    lambda *args, fn=fn: order.append("receive") or fn(*args))
            rcvd = a.counters["rcvd_pkts"]
            a.poll(8)
            assert order and order[0] == "send", order
            assert order.count("receive") >= 3 and not a._posts_owed, order
            assert a.counters["rcvd_pkts"] - rcvd >= 3
        assert all(_landed(ea, i) for i in (4, 5, 6))
        _until(lambda: b.counters["rcvd_pkts"] >= b_rcvd + 3)
        assert all(bytes(eb.buf.view[64 * i:64 * i + 8 * i]) == bytes([i]) * (8 * i)
                   for i in (1, 2, 3))
    finally:
        a.close()
        b.close()
