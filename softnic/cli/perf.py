"""``softnic perf``: perftest's benchmarks (ib_write_bw, ib_read_lat, ...) over softnic.

As with perftest, one process serves and one connects::

    softnic perf write_bw                 # server: waits on TCP port 18515
    softnic perf write_bw 127.0.0.1       # client: runs the test, both print results

The two exchange QP numbers, GIDs, rkeys and buffer addresses over a TCP side
channel (one JSON line each way), then move their RC QPs to RTS and run the
test through the pyverbs API.  The client's options decide the test; the
server takes them from the side channel.

Bandwidth tests keep ``--tx-depth`` work requests in flight on every QP (and
a SEND test's server ``--rx-depth`` receives posted, 512 as perftest's) and
report the average over the run and the peak over a window of at least a
twentieth of the completions and of the run's time.  Latency tests run one operation at a time: write_lat and
send_lat are ping-pongs (half the round trip is reported, as perftest does),
read_lat and atomic_lat report the whole round trip.  ``MB/sec`` is 2**20
bytes per second, as in perftest; ``--report_gbits`` gives 10**9 bits per second.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from collections import deque

TESTS = {
    "write_bw": ("write", "bw"), "write_lat": ("write", "lat"),
    "read_bw": ("read", "bw"), "read_lat": ("read", "lat"),
    "send_bw": ("send", "bw"), "send_lat": ("send", "lat"),
    "atomic_bw": ("atomic", "bw"), "atomic_lat": ("atomic", "lat"),
}
TITLES = {"write": "RDMA_Write", "read": "RDMA_Read", "send": "Send", "atomic": "Atomic"}
MTUS = (256, 512, 1024, 2048, 4096)
MAX_SIZE = 1 << 23
DEFAULT_PORT = 18515


def _data_path(nic) -> str:
    """Which per-packet loops the device runs (``softnic.accel``)."""
    k = getattr(getattr(nic, "dev", None), "kernel", None)
    return repr(k).strip("<>") if k is not None else "python loops"


class PerfError(Exception):
    """A run that cannot go on (bad option, peer gone, failed completion)."""


# ------------------------------------------------------------------ command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``perf`` parser: one subparser per test, each with perftest's options."""
    sub = p.add_subparsers(dest="perf_test", required=True, metavar="TEST")
    for name, (op, kind) in TESTS.items():
        t = sub.add_parser(name, help=f"{TITLES[op]} {'bandwidth' if kind == 'bw' else 'latency'}",
                           description=f"perftest's ib_{name} over softnic.  Without SERVER, "
                           "wait for a client; with it, connect and run.")
        t.add_argument("server", nargs="?", help="address of the waiting side (client mode)")
        t.add_argument("-p", "--port", type=int, default=DEFAULT_PORT,
                       help=f"TCP port of the side channel (default {DEFAULT_PORT})")
        t.add_argument("-d", "--ib-dev", default="softnic0", help="softnic device (softnic0)")
        t.add_argument("-s", "--size", type=_size, default=None,
                       help="message size in bytes (default 65536 for bw, 2 for lat; "
                       "atomics are 8)")
        t.add_argument("-a", "--all", action="store_true", help="all sizes 2 .. 2**23")
        t.add_argument("-n", "--iters", type=_positive, default=None,
                       help="iterations per size and QP (default 5000 bw, 1000 lat)")
        t.add_argument("--max-bytes", type=_positive, default=None,
                       help="cap the iterations of a size at this many bytes (with -a, so "
                       "large sizes end in time; at least 2 iterations)")
        t.add_argument("-q", "--qp", type=_positive, default=1, help="number of QPs (bw tests)")
        t.add_argument("-m", "--mtu", type=int, choices=MTUS, default=1024, help="path MTU")
        t.add_argument("-t", "--tx-depth", type=_positive, default=128,
                       help="work requests in flight per QP (bw tests)")
        t.add_argument("-r", "--rx-depth", type=_positive, default=512,
                       help="receives kept posted per QP (SEND bw tests; perftest's 512)")
        t.add_argument("-u", "--qp-timeout", type=int, default=14,
                       help="QP timeout: retransmission after 4.096 us * 2**timeout (14)")
        if name == "write_lat":
            t.add_argument("--poll-each", action="store_true",
                           help="after each WRITE, poll the send CQ until it completes, "
                           "then wait for the peer's (perftest's ib_write_lat loop; without "
                           "it a side waits for the peer's WRITE only)")
        t.add_argument("--report_gbits", action="store_true", help="bandwidth in Gb/sec")
        t.add_argument("--json", action="store_true", help="results as one JSON document")
        t.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
        t.add_argument("--connect-timeout", type=float, default=30.0,
                       help="seconds to wait for the peer (default 30)")
    from .perf_collectives import TESTS as COLLECTIVE_TESTS
    for name, (arguments, _, _) in COLLECTIVE_TESTS.items():
        arguments(sub.add_parser(name, help=f"{name} over softnic.collectives, a size sweep "
                                 "like nccl-tests"))


def _size(text: str) -> int:
    v = int(text)
    if not 1 <= v <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"size {v} outside 1..{MAX_SIZE}")
    return v


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} is not a positive count")
    return v


def plan(args) -> dict:
    """What the client asks for: the test, its sizes and counts."""
    op, kind = TESTS[args.perf_test]
    if args.all:
        sizes = [1 << i for i in range(1, 24)]
    else:
        sizes = [args.size or (65536 if kind == "bw" else 2)]
    if op == "atomic":
        sizes = [8]
    iters = args.iters or (5000 if kind == "bw" else 1000)
    qps = args.qp if kind == "bw" else 1
    return {"test": args.perf_test, "op": op, "kind": kind, "sizes": sizes, "iters": iters,
            "max_bytes": args.max_bytes,
            "qps": qps, "mtu": args.mtu, "tx_depth": args.tx_depth, "timeout": args.qp_timeout,
            "rx_depth": args.rx_depth if op == "send" and kind == "bw" else 4,
            "poll_each": bool(getattr(args, "poll_each", False))}


def main(args) -> int:
    from .perf_collectives import TESTS as COLLECTIVE_TESTS
    if args.perf_test in COLLECTIVE_TESTS:
        return COLLECTIVE_TESTS[args.perf_test][1](args)
    try:
        if args.server is None:
            return serve(args)
        return run_client(args)
    except PerfError as e:
        print(f"softnic perf: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# ------------------------------------------------------------------ side channel

class Channel:
    """One JSON document per line over a TCP connection."""

    def __init__(self, sock: socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.rfile = sock.makefile("rb")

    def send(self, doc: dict) -> None:
        self.sock.sendall(json.dumps(doc).encode() + b"\n")

    def recv(self) -> dict:
        line = self.rfile.readline()
        if not line:
            raise PerfError("the peer closed the side channel")
        return json.loads(line)

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


# ------------------------------------------------------------------ resources

class Endpoint:
    """Context, PD, CQ, one MR and ``qps`` RC QPs on a softnic device."""

    def __init__(self, dev: str, p: dict):
        import verbs_api.enums as e
        from verbs_api.cq import CQ
        from verbs_api.device import Context
        from verbs_api.mr import MR
        from verbs_api.pd import PD
        from verbs_api.qp import QP, QPAttr, QPCap, QPInitAttr
        self.e = e
        try:
            self.ctx = Context(name=dev)
        except Exception as exc:
            raise PerfError(f"cannot open device {dev}: {exc}") from None
        depth = p["tx_depth"] if p["kind"] == "bw" else 4
        self.depth = depth
        # receives posted per QP: more than the sender keeps in flight, as
        # perftest's --rx-depth, since a SEND completes at its sender once it has
        # landed, before this side's program reposts the receive it took
        self.rx_depth = rx = p.get("rx_depth", 4)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, p["qps"] * (depth + rx + 8) + 64)
        self.half = max(max(p["sizes"]), 64)
        access = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                  e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)
        self.mr = MR(self.pd, 2 * self.half, access)     # [send area | receive area]
        cap = QPCap(max_send_wr=depth + 4, max_recv_wr=rx + 4, max_send_sge=1,
                    max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=0)
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = access & ~e.IBV_ACCESS_LOCAL_WRITE
        self.qps = [QP(self.pd, init, attr) for _ in range(p["qps"])]
        self.nic = self.ctx.nic
        self.prepared = False

    def info(self) -> dict:
        return {"gid": str(self.ctx.query_gid(1, 0)), "qpns": [q.qp_num for q in self.qps],
                "rkey": self.mr.rkey, "addr": self.mr.buf, "half": self.half}

    def connect(self, peer: dict, p: dict) -> None:
        from verbs_api.addr import AHAttr, GlobalRoute
        from verbs_api.qp import QPAttr
        e = self.e
        mtu = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
               2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}[p["mtu"]]
        for qp, dqpn in zip(self.qps, peer["qpns"]):
            attr = QPAttr(port_num=1, path_mtu=mtu)
            attr.qp_access_flags = (e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ |
                                    e.IBV_ACCESS_REMOTE_ATOMIC)
            attr.dest_qp_num = dqpn
            attr.rq_psn = 0
            attr.sq_psn = 0
            attr.ah_attr = AHAttr(port_num=1, is_global=1,
                                  gr=GlobalRoute(dgid=peer["gid"], sgid_index=0))
            attr.max_dest_rd_atomic = 16
            attr.max_rd_atomic = 16
            attr.min_rnr_timer = 1
            attr.timeout = p["timeout"]
            attr.retry_cnt = 7
            attr.rnr_retry = 7
            qp.to_rts(attr)

    def close(self) -> None:
        self.ctx.close()


STALL = 30.0       # seconds without a completion before a run is given up


def _poll(ep: Endpoint, n: int, deadline: float = 0.0) -> list:
    """Up to ``n`` completions, at least one, all successful (PerfError otherwise,
    also when none comes for ``STALL`` seconds)."""
    e = ep.e
    cq = ep.cq
    got, wcs = cq.poll(n)
    deadline = time.monotonic() + STALL
    while True:
        if got:
            for w in wcs:
                if w.status != e.IBV_WC_SUCCESS:
                    raise PerfError(f"completion failed: wr_id {w.wr_id} status {w.status} "
                                    f"(vendor error {w.vendor_err})")
            return wcs
        if time.monotonic() > deadline:
            raise PerfError("completions did not arrive in time (is the peer alive?)")
        got, wcs = cq.poll(n)


class Progress:
    """A line on stderr about once a second, after the first second of a size."""

    def __init__(self, enabled: bool, size: int, total: int):
        self.enabled, self.size, self.total = enabled, size, total
        self.t0 = time.monotonic()
        self.next = self.t0 + 1.0

    def tick(self, done: int) -> None:
        if self.enabled and done & 63 == 0 and done:
            now = time.monotonic()
            if now >= self.next:
                self.next = now + 1.0
                print(f"  {self.size} B: {done}/{self.total} ({100 * done // self.total} %), "
                      f"{now - self.t0:.0f} s", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the tests

def _wr(ep: Endpoint, p: dict, peer: dict, size: int, wr_id: int, signaled: bool):
    from verbs_api.wr import SGE, SendWR
    e = ep.e
    op = p["op"]
    flags = e.IBV_SEND_SIGNALED if signaled else 0
    if op == "atomic":
        wr = SendWR(wr_id, e.IBV_WR_ATOMIC_FETCH_AND_ADD, 1,
                    sg=[SGE(ep.mr.buf + ep.half, 8, ep.mr.lkey)], send_flags=flags)
        wr.set_wr_atomic(peer["rkey"], peer["addr"], 1)
        return wr
    if op == "read":
        wr = SendWR(wr_id, e.IBV_WR_RDMA_READ, 1, sg=[SGE(ep.mr.buf + ep.half, size, ep.mr.lkey)],
                    send_flags=flags)
        wr.set_wr_rdma(peer["rkey"], peer["addr"])
        return wr
    if op == "write":
        wr = SendWR(wr_id, e.IBV_WR_RDMA_WRITE, 1, sg=[SGE(ep.mr.buf, size, ep.mr.lkey)],
                    send_flags=flags)
        wr.set_wr_rdma(peer["rkey"], peer["addr"] + peer["half"])
        return wr
    return SendWR(wr_id, e.IBV_WR_SEND, 1, sg=[SGE(ep.mr.buf, size, ep.mr.lkey)],
                  send_flags=flags)


def _post_recvs(ep: Endpoint, qp, size: int, n: int) -> None:
    """``n`` receives into the second half of the buffer, one post each, the one
    work request reposted (as perftest reposts its ``rwr``)."""
    wr = getattr(ep, "_rwr", None)
    if wr is None:
        from verbs_api.wr import SGE, RecvWR
        wr = ep._rwr = RecvWR(0, 1, [SGE(ep.mr.buf + ep.half, ep.half, ep.mr.lkey)])
    post = qp.post_recv
    for _ in range(n):
        post(wr)


def iterations(p: dict, size: int) -> int:
    """``-n``, or fewer where ``--max-bytes`` caps a large size (2 at least)."""
    n = p["iters"]
    if p.get("max_bytes"):
        n = min(n, max(2, p["max_bytes"] // size))
    return n


def peak_rate(stamps: list, t0: float, elapsed: float) -> float:
    """The highest completion rate over a stretch of at least a twentieth of the
    run (``stamps``: (completions so far, time), every twentieth of them).  One
    coalesced ACK completes many work requests at once, so two stamps may lie
    microseconds apart: a rate between those would be the burst's, not the link's."""
    span = elapsed / 20
    points = [(0, t0)] + stamps
    peak = 0.0
    for j in range(1, len(points)):
        n, t = points[j]
        for n0, s0 in reversed(points[:j]):
            if t - s0 >= span:
                peak = max(peak, (n - n0) / (t - s0))
                break
    return peak


def bw_client(ep: Endpoint, p: dict, peer: dict, size: int, progress: Progress) -> dict:
    """Keep ``tx_depth`` WRs in flight on every QP; every one is signaled, so a
    completion frees its slot.  Returns times of completions for the peak."""
    iters, qps, depth = iterations(p, size), ep.qps, ep.depth
    total = iters * len(qps)
    posted = [0] * len(qps)
    inflight = [0] * len(qps)
    done = 0
    stamps = []
    window = max(1, total // 20)
    deadline = time.monotonic() + 600
    wrs = [_wr(ep, p, peer, size, i, True) for i in range(len(qps))]
    # QPs with a free slot, so that a round costs what it posts, not the QP count
    ready = deque(range(len(qps)))
    queued = [True] * len(qps)
    t0 = time.perf_counter()
    while done < total:
        while ready:
            i = ready.popleft()
            queued[i] = False
            k = min(depth - inflight[i], iters - posted[i])
            if k > 0:
                w, qp = wrs[i], qps[i]
                for _ in range(k):
                    qp.post_send(w)
                posted[i] += k
                inflight[i] += k
        wcs = _poll(ep, 64, deadline)
        now = time.perf_counter()
        for w in wcs:
            i = w.wr_id
            inflight[i] -= 1
            if not queued[i] and posted[i] < iters:
                queued[i] = True
                ready.append(i)
        before = done
        done += len(wcs)
        if done // window != before // window:
            stamps.append((done, now))
        progress.tick(done)
    elapsed = time.perf_counter() - t0
    peak = peak_rate(stamps, t0, elapsed)
    rate = total / elapsed
    return {"bytes": size, "iterations": iters, "qps": len(qps), "seconds": elapsed,
            "msg_rate": rate, "bytes_per_sec": rate * size,
            "peak_bytes_per_sec": max(peak, rate) * size}


def send_bw_server(ep: Endpoint, p: dict, size: int) -> dict:
    """Receive ``iters`` SENDs on every QP, keeping receives posted."""
    qps, iters = ep.qps, iterations(p, size)
    by_qpn = {qp.qp_num: qp for qp in qps}
    total = iters * len(qps)
    deadline = time.monotonic() + 600
    got = 0
    t0 = None
    while got < total:
        wcs = _poll(ep, 64, deadline)
        if t0 is None:
            t0 = time.perf_counter()
        got += len(wcs)
        for w in wcs:
            _post_recvs(ep, by_qpn[w.qp_num], size, 1)
    elapsed = time.perf_counter() - (t0 or time.perf_counter())
    return {"bytes": size, "received": got, "seconds": elapsed}


def _spin_byte(ep: Endpoint, offset: int, value: int, deadline: float) -> None:
    """Drive progress until the byte at ``offset`` of our MR reads ``value``."""
    import ctypes
    byte = ctypes.c_ubyte.from_address(ep.mr.buf + offset)
    cq = ep.cq
    e = ep.e
    deadline = time.monotonic() + STALL
    while byte.value != value:
        n, wcs = cq.poll(8)       # drives progress; completions of our own signaled WRITEs
        for w in wcs:
            if w.status != e.IBV_WC_SUCCESS:
                raise PerfError(f"completion failed: status {w.status}")
        if time.monotonic() > deadline:
            raise PerfError("the peer's WRITE did not arrive in time")


def lat_run(ep: Endpoint, p: dict, peer: dict, size: int, initiator: bool,
            progress: Progress) -> list[float]:
    """One side of a latency test; the initiator's round-trip times (seconds)."""
    import ctypes
    op, iters = p["op"], iterations(p, size)
    qp = ep.qps[0]
    deadline = time.monotonic() + 600
    warm = min(50, iters)
    times = []
    if op in ("read", "atomic"):
        if not initiator:
            return times
        wr = _wr(ep, p, peer, size, 0, True)
        for i in range(iters + warm):
            t = time.perf_counter()
            qp.post_send(wr)
            _poll(ep, 1, deadline)
            if i >= warm:
                times.append(time.perf_counter() - t)
            progress.tick(max(0, i - warm))
        return times
    if op == "send":
        # Count completions rather than pairing them per iteration: the peer's next
        # SEND may complete in the same poll as the ACK of ours.  Both sides posted
        # their receives before the size began (``prepare``).
        # A receive taken is posted again once this side's SEND is on its way, off
        # the round trip: ``prepare`` posted ``rx_depth`` of them, so the queue never
        # runs dry while one is owed.
        wr = _wr(ep, p, peer, size, 0, True)
        recvd = sent = 0
        recv_op = ep.e.IBV_WC_RECV
        for i in range(iters + warm):
            t = time.perf_counter()
            if initiator:
                qp.post_send(wr)
            owed = 0
            while recvd <= i or sent < i - 2:
                for w in _poll(ep, 4, deadline):
                    if w.opcode == recv_op:
                        recvd += 1
                        owed += 1
                    else:
                        sent += 1
            if not initiator:
                qp.post_send(wr)
            elif i >= warm:
                times.append(time.perf_counter() - t)
            _post_recvs(ep, qp, size, owed)
            progress.tick(max(0, i - warm))
        while sent < iters + warm:
            sent += sum(1 for w in _poll(ep, 4, deadline) if w.opcode != recv_op)
        return times
    # write: both sides write the peer's receive area; the last byte carries a
    # sequence number the receiver spins on (as perftest's write_lat does).  With
    # ``poll_each``, as perftest's loop, each side takes its WRITE's completion
    # before it waits for the peer's WRITE: the ACK it waits for is the one the
    # peer holds behind its own next WRITE.
    wr = _wr(ep, p, peer, size, 0, True)
    last = size - 1
    poll_each = p.get("poll_each", False)
    for i in range(iters + warm):
        seq = (i % 255) + 1
        t = time.perf_counter()
        if initiator:
            ctypes.memset(ep.mr.buf + last, seq, 1)
            qp.post_send(wr)
            if poll_each:
                _poll(ep, 1, deadline)
            _spin_byte(ep, ep.half + last, seq, deadline)
            if i >= warm:
                times.append(time.perf_counter() - t)
        else:
            _spin_byte(ep, ep.half + last, seq, deadline)
            ctypes.memset(ep.mr.buf + last, seq, 1)
            qp.post_send(wr)
            if poll_each:
                _poll(ep, 1, deadline)
        progress.tick(max(0, i - warm))
    # drain our own WRITE completions
    return times


def prepare(ep: Endpoint, p: dict, size: int) -> None:
    """Receives posted before a size starts, so no SEND meets an empty queue."""
    if p["op"] == "send" and not ep.prepared:
        ep.prepared = True            # each completion reposts one: the count holds
        for qp in ep.qps:
            _post_recvs(ep, qp, size, ep.rx_depth)


def lat_summary(times: list[float], size: int, iters: int, half: bool) -> dict:
    xs = sorted(t * 1e6 / (2 if half else 1) for t in times)
    n = len(xs)

    def pct(q):
        return xs[min(n - 1, max(0, int(round(q * n)) - 1))]
    return {"bytes": size, "iterations": iters, "t_min_us": xs[0], "t_max_us": xs[-1],
            "t_typical_us": statistics.median(xs), "t_avg_us": statistics.fmean(xs),
            "t_stdev_us": statistics.pstdev(xs), "t_99_us": pct(0.99),
            "t_99_9_us": pct(0.999), "one_way": half}


# ------------------------------------------------------------------ output

LINE = "-" * 87


def header(p: dict, role: str, dev: str, gid: str) -> str:
    op, kind = p["op"], p["kind"]
    title = f"{TITLES[op]} {'BW' if kind == 'bw' else 'Latency'} Test"
    rows = [LINE, f"{title:^87}",
            f" Number of qps   : {p['qps']}\t\tTransport type : IB",
            " Connection type : RC\t\tUsing SRQ      : OFF",
            f" Device          : {dev} ({role})",
            f" TX depth        : {p['tx_depth'] if kind == 'bw' else 1}",
            f" Mtu             : {p['mtu']}[B]",
            " Link type       : Ethernet (RoCEv2 over UDP, softnic)",
            f" GID             : {gid}", LINE]
    if kind == "bw":
        rows.append(" #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]"
                    .format(u="Gb/sec" if p.get("gbits") else "MB/sec"))
    else:
        rows.append(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
                    "t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]")
    return "\n".join(rows)


def bw_row(r: dict, gbits: bool) -> str:
    def unit(x):
        return x * 8 / 1e9 if gbits else x / (1 << 20)
    return (f" {r['bytes']:<10} {r['iterations']:<10}       {unit(r['peak_bytes_per_sec']):>10.2f}"
            f"         {unit(r['bytes_per_sec']):>10.2f}             {r['msg_rate'] / 1e6:.6f}")


def lat_row(r: dict) -> str:
    return (f" {r['bytes']:<6} {r['iterations']:<10}   {r['t_min_us']:>10.2f}     "
            f"{r['t_max_us']:>10.2f}     {r['t_typical_us']:>10.2f}     {r['t_avg_us']:>10.2f}"
            f"     {r['t_stdev_us']:>10.2f}          {r['t_99_us']:>10.2f}              "
            f"{r['t_99_9_us']:>10.2f}")


# ------------------------------------------------------------------ the two roles

def _banner(args, p, role, ep, show):
    if show:
        p = dict(p, gbits=args.report_gbits)
        print(header(p, role, args.ib_dev, ep.info()["gid"]), flush=True)


def run_client(args) -> int:
    p = plan(args)
    deadline = time.monotonic() + args.connect_timeout
    while True:           # the server may still be starting: try again until the timeout
        try:
            sock = socket.create_connection((args.server, args.port),
                                            timeout=args.connect_timeout)
            break
        except (ConnectionRefusedError, ConnectionResetError) as exc:
            if time.monotonic() > deadline:
                raise PerfError(f"cannot reach the server at {args.server}:{args.port}: "
                                f"{exc}") from None
            time.sleep(0.05)
        except OSError as exc:
            raise PerfError(f"cannot reach the server at {args.server}:{args.port}: "
                            f"{exc}") from None
    sock.settimeout(None)
    ch = Channel(sock)
    ep = Endpoint(args.ib_dev, p)
    try:
        ch.send({"plan": p, "peer": ep.info()})
        reply = ch.recv()
        if "error" in reply:
            raise PerfError(f"the server refused: {reply['error']}")
        peer = reply["peer"]
        ep.connect(peer, p)
        ch.send({"ready": True})
        ch.recv()
        show = not args.json
        _banner(args, p, "client", ep, show)
        results = []
        for size in p["sizes"]:
            ch.send({"size": size})
            ch.recv()                                    # the server is set for this size
            prog = Progress(not args.no_progress, size, iterations(p, size) *
                            (len(ep.qps) if p["kind"] == "bw" else 1))
            if p["kind"] == "bw":
                r = bw_client(ep, p, peer, size, prog)
                if p["op"] == "send":
                    ch.send({"done": True})
                    r["server"] = ch.recv()
                else:
                    ch.send({"done": True})
                    ch.recv()
                if show:
                    print(bw_row(r, args.report_gbits), flush=True)
            else:
                if p["kind"] == "lat":
                    prepare(ep, p, size)
                times = lat_run(ep, p, peer, size, True, prog)
                ch.send({"done": True})
                ch.recv()
                r = lat_summary(times, size, iterations(p, size),
                                half=p["op"] in ("write", "send"))
                if show:
                    print(lat_row(r), flush=True)
            results.append(r)
        ch.send({"end": True})
        if show:
            print(LINE)
        else:
            doc = {"test": p["test"], "role": "client", "device": args.ib_dev,
                   "mtu": p["mtu"], "qps": p["qps"], "tx_depth": p["tx_depth"],
                   "iterations": p["iters"], "results": results,
                   "data_path": _data_path(ep.nic), "counters": ep.nic.counters}
            print(json.dumps(doc, indent=1))
        return 0
    finally:
        ep.close()
        ch.close()


def serve(args) -> int:
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        ls.bind(("0.0.0.0", args.port))
    except OSError as exc:
        raise PerfError(f"cannot listen on TCP port {args.port}: {exc}") from None
    ls.listen(1)
    if not args.json:
        print("\n************************************\n* Waiting for client to connect... *"
              "\n************************************", flush=True)
    ls.settimeout(None)
    conn, _ = ls.accept()
    ls.close()
    ch = Channel(conn)
    ep = None
    try:
        first = ch.recv()
        p, peer = first["plan"], first["peer"]
        if p["test"] != args.perf_test:
            ch.send({"error": f"server runs {args.perf_test}, client asked for {p['test']}"})
            raise PerfError(f"client asked for {p['test']}, this server runs {args.perf_test}")
        ep = Endpoint(args.ib_dev, p)
        ch.send({"peer": ep.info()})
        ep.connect(peer, p)
        ch.recv()
        ch.send({"ready": True})
        show = not args.json
        _banner(args, p, "server", ep, show)
        results = []
        while True:
            msg = ch.recv()
            if "end" in msg:
                break
            size = msg["size"]
            prog = Progress(False, size, p["iters"])
            if p["kind"] == "bw":
                if p["op"] == "send":
                    prepare(ep, p, size)
                    ch.send({"set": True})
                    r = send_bw_server(ep, p, size)
                    ch.recv()
                    ch.send(r)
                else:
                    ch.send({"set": True})
                    ch.recv()                        # one-sided: nothing to do here
                    ch.send({"ok": True})
                    r = {"bytes": size}
            else:
                prepare(ep, p, size)
                ch.send({"set": True})
                lat_run(ep, p, peer, size, False, prog)
                ch.recv()
                ch.send({"ok": True})
                r = {"bytes": size}
            results.append(r)
        if show:
            print(LINE)
        else:
            print(json.dumps({"test": p["test"], "role": "server", "device": args.ib_dev,
                              "results": results, "counters": ep.nic.counters}, indent=1))
        return 0
    finally:
        if ep is not None:
            ep.close()
        ch.close()
