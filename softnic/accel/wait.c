/* The progress thread's sleep, without the interpreter lock (cffi releases it
   around the call): one ppoll(2) on the device's socket and its doorbell.

   ``lease`` is shared with the threads that drive progress inline (a program
   spinning on its CQ): lease[0] is CLOCK_MONOTONIC in ns at their latest step,
   lease[1] is nonzero while one of them is inside a step or holds output for
   its next call (above 1: ACKs held for its answer until that time in ns, which
   its polls leave held until then); lease[2] is set by the thread while it waits on a lease;
   lease[3] is the engine's next deadline (ns), which the thread sleeps toward
   and re-reads when it gets there, so a timer re-armed later (each message's
   retransmission timer) costs no wake-up with the interpreter lock.  While the
   lease is younger than ``grace_ns`` (``hold_ns`` while lease[1] is set: held
   output is not kept from the peer long), that caller will do the work: the
   thread waits for the bell or the lease lapsing, never taking the interpreter
   lock from it, and does not watch the socket meanwhile (a spinner on a machine
   with few cores would lose its CPU to a wake-up per datagram).  A lease may lie
   ahead (a thread asleep on the socket holds one for as long as it may sleep)
   and be shortened without a ring, so the thread looks again at least every
   grace_ns (sn_park); while a caller holding output keeps renewing its lease,
   the thread's parks grow toward half of grace_ns (below).  Otherwise the
   thread returns at once, so a datagram that
   lands while the program does not call softnic (it spins on memory, it sleeps)
   is handled within a wake-up, not a scheduler tick.

   A caller giving its lease back sets lease[2] to 2 and rings: the thread takes
   that ring itself and watches the socket again.

   lease[4] is the thread id of the caller that renewed the lease last (0: none
   to ask about: a lease ahead, held by a thread asleep on the socket itself).
   A lease is kept only while that thread runs or waits for a CPU (its state in
   /proc is R): a spinner the scheduler preempted keeps it, but a program that
   polled and then went to sleep elsewhere (poll(2) on a socket of its own with
   a timeout, as ucx_perftest does while it waits for its peer) does not, and
   what arrives is the thread's at once, not when the lease lapses.  The thread
   asks each time it looks at a fresh lease (on a wake-up: a datagram while it
   watches the socket, a ring, a park's end), and a lease whose holder it found
   running it waits out SN_REASK_NS at a time: a holder preempted just after its
   poll, then asleep elsewhere, loses the lease within that, not when a long
   lease (SOFTNIC_SPIN_LEASE_US) lapses.

   ``sn_wait_spin``'s ``spin_ns``: where the thread would sleep on the socket and
   the bell (no caller's lease), it first looks at both without sleeping for that
   long from the call, as a driver busy-polls its NIC after traffic (Linux's
   busy_poll): a datagram that lands while the thread spins costs the sender no
   wake-up of a sleeping thread (on a virtual machine an idle vCPU's, tens of us
   inside the sender's sendmsg) and the thread none either.  The progress thread
   asks for it only after a datagram woke it while its program does not drive
   the device (the passive side of a READ or of one-sided traffic), so it never
   spins beside a program spinning on its own CQ.

   An idle park.  A thread that waits out the lease of a caller that keeps
   polling wakes once a lease (1 ms) only to find it renewed; on a machine whose
   cores the spinners fill, each such wake-up preempts one of them.  So where
   lease[5] is set (the driver sets it while it has raised the thread's priority:
   the process may then also leave SCHED_IDLE), a park on a lease that its
   holder renewed since the thread last looked, and that it found running both
   times, is waited out under SCHED_IDLE (sched(7)): its wake-up then preempts
   nobody and runs when a CPU is free, or when the running caller's time slice
   ends.  lease[6] holds the thread's id while it is so lowered (0: it is not),
   and anything that rings the bell or gives the lease back raises it first
   (NIC.ring, NIC.end_lease), so an answer the program waits for is not left to
   an idle thread; the thread raises itself before it watches the socket, before
   any other park, and before it returns.  What this costs: a holder that stops
   calling softnic while it keeps running (it computes, or spins on memory
   without giving its lease back) is noticed when the scheduler next runs the
   thread (the end of that caller's slice, a few ms) rather than when its lease
   lapses.  lease[7] counts the times the thread lowered itself (the idle parks
   that follow one keep it lowered).

   Returns 1: a datagram waits; 4: the same, found while spinning; 2: the bell
   rang (read it); 3: a caller went away holding output; 0: ``timeout_ns`` or
   lease[3] passed (-1: no timeout); -errno. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

static int64_t sn_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int sn_ppoll(struct pollfd *p, int n, int64_t ns)
{
    struct timespec t;
    if (ns < 0)
        return ppoll(p, n, NULL, NULL);
    t.tv_sec = ns / 1000000000;
    t.tv_nsec = ns % 1000000000;
    return ppoll(p, n, &t, NULL);
}

/* The bell rang while the thread waited on a lease: if the ring was a caller
   giving its lease back (lease[2] == 2, end_lease), take it here and go on
   watching the socket, without waking the interpreter for nothing (anything else
   rung meanwhile is a moved deadline, re-read from lease[3]; close moves that
   deadline to the past).  1: it was; 0: return 2. */
static int sn_lease_returned(volatile int64_t *l, int bell)
{
    uint64_t v;
    if (l[2] != 2)
        return 0;
    l[2] = 0;
    if (read(bell, &v, sizeof v) < 0 && errno != EAGAIN)
        return 0;
    return 1;
}

/* Does the thread that renewed the lease last (lease[4]) run, or wait for a CPU?
   1 where it cannot be told (no thread named, /proc unreadable); 0 if it is asleep
   (or stopped, or gone). */
static int sn_holder_runs(volatile int64_t *l)
{
    char path[64], buf[192];
    int64_t tid = l[4];
    if (tid <= 0)
        return 1;
    snprintf(path, sizeof path, "/proc/self/task/%lld/stat", (long long)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : 1;     /* (ENOENT: the thread is gone) */
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 1;
    buf[n] = 0;
    /* "tid (comm) S ...": the command may hold any byte, so from its last ')' */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return 1;
    return p[2] == 'R';
}

/* About to wait out the lease stamped ``l0``: say so (lease[2], which end_lease
   reads after it gives the lease back, to ring the thread), then look at the
   stamp again.  Given back in between (end_lease has not seen lease[2] set: no
   ring comes), the thread looks again at once rather than parking blind for the
   lease it read (1).  A stamp renewed in between needs no second look: the park
   is only shorter than it could be.  (Exported for tests/test_progress.py.) */
int sn_announce_park(volatile int64_t *l, int64_t l0)
{
    l[2] = 1;
    __sync_synchronize();
    if (l[0] < l0) {
        l[2] = 0;
        return 1;
    }
    return 0;
}

/* How long to wait out a fresh lease before looking again: until it lapses or the
   deadline, but no longer than a spinner's lease at a time.  A lease may be
   shortened without a ring: a C face's thread that slept on the socket holding a
   long lease hands the program a spinner's one when it returns with its event,
   and its next call renews or ends that (ringing a thread parked here would cost
   a context switch per event). */
#define SN_REASK_NS 10000000LL      /* 10 ms: the lease[4] paragraph at the top */

static int64_t sn_park(int64_t left, int64_t fresh, int64_t grace_ns, int asked)
{
    int64_t t = fresh;
    if (grace_ns > 0 && grace_ns < t)
        t = grace_ns;
    if (asked && t > SN_REASK_NS)
        t = SN_REASK_NS;            /* its holder ran: ask again before long */
    return left >= 0 && left < t ? left : t;
}

/* Wait out a lease stamped ``l0`` for ``ns`` on the bell alone (``b``, its
   pollfd): announced (sn_announce_park), so a caller giving the lease back rings.
   0: look again (the park ended, the lease was given back, or it moved before
   the park); 2: the bell rang for something else (read it); -errno. */
static int sn_park_on_bell(volatile int64_t *l, int64_t l0, struct pollfd *b, int bell,
                           int64_t ns)
{
    if (sn_announce_park(l, l0))
        return 0;
    int r = 0, n = sn_ppoll(b, 1, ns);
    if (n < 0 && errno != EINTR)
        r = -errno;
    else if (n > 0 && b->revents & (POLLERR | POLLNVAL))
        r = -EBADF;
    else if (n > 0 && sn_lease_returned(l, bell))
        return 0;                   /* (it cleared lease[2]) */
    else if (n > 0)
        r = 2;
    l[2] = 0;
    return r;
}

/* The idle park's two ends (the paragraph at the top): lowered to SCHED_IDLE for
   a park, where lease[5] allows it, its id in lease[6] and the change counted in
   lease[7] before it is made (once lowered, the thread may not run again until
   a CPU is free: whoever sees it lowered sees it counted); and raised back
   (SCHED_OTHER keeps the thread's nice value), which NIC.ring and
   NIC.end_lease may have done already. */
static void sn_idle_park(volatile int64_t *l)
{
    struct sched_param sp = {0};
    if (l[6] || !l[5])
        return;
    l[6] = (int64_t)syscall(SYS_gettid);
    l[7] += 1;
    __sync_synchronize();
    if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0) {
        l[7] -= 1;
        l[6] = 0;
    }
}

static void sn_idle_end(volatile int64_t *l)
{
    struct sched_param sp = {0};
    if (!l[6])
        return;
    if (sched_setscheduler(0, SCHED_OTHER, &sp) != 0)
        l[5] = 0;               /* (lease[5] said it may: never lowered again) */
    l[6] = 0;
}

/* About to park on the lease stamped l0, whose holder this look found running
   (asked) or did not ask about: an idle park if a look before found a running
   holder too and the lease was renewed since (ran: that look's stamp); a park
   while a step is under way or holds output (lease[1]: not asked about) stays
   as the thread is; any other at the thread's own priority.  Returns the stamp
   for the next look. */
static int64_t sn_lowered_for(volatile int64_t *l, int64_t l0, int64_t ran, int asked)
{
    if (asked && ran >= 0 && l0 != ran)
        sn_idle_park(l);
    else if (asked || !l[1])
        sn_idle_end(l);
    return asked ? l0 : ran;
}

static int sn_wait_loop(int sock, int bell, int64_t timeout_ns, int64_t *lease,
                        int64_t grace_ns, int64_t hold_ns, int64_t spin_ns);

int sn_wait_spin(int sock, int bell, int64_t timeout_ns, int64_t *lease, int64_t grace_ns,
                 int64_t hold_ns, int64_t spin_ns)
{
    int r = sn_wait_loop(sock, bell, timeout_ns, lease, grace_ns, hold_ns, spin_ns);
    sn_idle_end(lease);
    return r;
}

int sn_wait(int sock, int bell, int64_t timeout_ns, int64_t *lease, int64_t grace_ns,
            int64_t hold_ns)
{
    return sn_wait_spin(sock, bell, timeout_ns, lease, grace_ns, hold_ns, 0);
}

static int sn_wait_loop(int sock, int bell, int64_t timeout_ns, int64_t *lease,
                        int64_t grace_ns, int64_t hold_ns, int64_t spin_ns)
{
    volatile int64_t *l = lease;
    int64_t called = sn_now_ns();
    int64_t stop = timeout_ns < 0 ? -1 : called + timeout_ns;
    int64_t spin_until = spin_ns > 0 ? called + spin_ns : 0;
    int spun = 0;                       /* the datagram was found while spinning */
    int64_t seen = 0, held_park = 0;    /* the caller's lease at the last look; see below */
    int64_t ran = -1;                   /* the stamp of the lease whose holder the last
                                           look found running (-1: none): an idle park's */
    struct pollfd p[2];
    for (;;) {
        int64_t now = sn_now_ns(), left = -1, fresh, end = stop, d = l[3];
        int n, pending, asked;
        if (d > 0 && (end < 0 || d < end))
            end = d;
        if (end >= 0) {
            left = end - now;
            if (left <= 0)
                return 0;
        }
        p[0].fd = sock; p[0].events = POLLIN; p[0].revents = 0;
        p[1].fd = bell; p[1].events = POLLIN; p[1].revents = 0;
        int64_t l0 = l[0];
        fresh = l0 + (l[1] ? hold_ns : grace_ns) - now;
        pending = l[1] != 0;
        if (!pending) {
            n = poll(p, 1, 0);
            pending = n > 0 && (p[0].revents & (POLLIN | POLLERR));
            p[0].revents = 0;
        }
        asked = fresh > 0 && !l[1] && l[0] <= now && l[4] > 0;
        if (asked && !sn_holder_runs(l))
            fresh = 0;                  /* its holder sleeps elsewhere: lapsed */
        if (pending && fresh <= 0)
            return l[1] ? 3 : spun ? 4 : 1;
        if (pending) {
            /* an inline caller is at work and will take this: wait out its lease
               (lease[2] says so: a caller giving its lease back rings the bell) */
            int64_t t = fresh;
            if (l[1] && seen && l[0] != seen) {
                /* Output held by a caller that renewed its lease since the thread
                   last looked (a receiver coalescing the ACKs of a stream polls
                   all the while): each such look doubles the park, up to half a
                   spinner's lease, rather than waking the thread (which preempts
                   that caller on a machine whose cores the spinners fill) every
                   hold_ns.  The first look, and one that finds the lease as it
                   was, parks for what is left of the hold, so output a caller
                   leaves held waits hold_ns if it never calls again after holding
                   it, and at most about grace_ns if it goes away later. */
                held_park = held_park ? 2 * held_park : hold_ns;
                if (held_park > grace_ns / 2)
                    held_park = grace_ns / 2;
                if (held_park > t)
                    t = held_park;
            } else {
                held_park = 0;
            }
            seen = l[0];
            spun = 0;
            ran = sn_lowered_for(l, l0, ran, asked);
            if ((n = sn_park_on_bell(l, l0, p + 1, bell, sn_park(left, t, grace_ns, asked))))
                return n;
            continue;
        }
        if (fresh > 0) {
            /* a caller is spinning and takes what arrives: sleep on the bell alone
               until its lease would lapse, rather than waking (a context switch on
               a machine whose cores the spinners fill) for each datagram it takes */
            spun = 0;
            ran = sn_lowered_for(l, l0, ran, asked);
            if ((n = sn_park_on_bell(l, l0, p + 1, bell, sn_park(left, fresh, grace_ns, asked))))
                return n;
            continue;
        }
        sn_idle_end(l);                 /* (it watches the socket: a datagram's wake-up
                                           must preempt) */
        ran = -1;
        spun = now < spin_until;
        if (spun) {
            n = poll(p, 2, 0);              /* spinning: look, do not sleep */
            if (n == 0)
                continue;
        } else {
            n = sn_ppoll(p, 2, left);
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            continue;               /* the deadline may have moved on meanwhile */
        /* (POLLERR on the socket is an ICMP error for an earlier send, which the
           receive that follows reports and clears: a datagram, for this purpose) */
        if ((p[0].revents | p[1].revents) & POLLNVAL || p[1].revents & POLLERR)
            return -EBADF;
        if (p[1].revents & POLLIN)
            return 2;
        /* a datagram: loop, to leave it to a caller whose lease is fresh */
    }
}
