"""The lossy teardown case, run many times: does any run hang?

Two programs, each on its own softnic device, connect through
rdma_cm, exchange one SEND each way and end their QP the moment their last
completion is in.  If the ACK of a SEND is the datagram lost and its receiver
has ended its QP before the SEND's retransmission arrives (the client ends at
its receive; the server at its SEND's completion, which can come before the
client's retransmission), nobody is left to answer: that SEND must end after
``retry_cnt`` retries (librdmacm's default 7) with ``IBV_WC_RETRY_EXC_ERR``, as
on mlx5, though its data arrived.  (With 7 as "for ever", rxe's quirk, that
run hung.)

Programs (``--program``):

``pyverbs``   this file's own ``--role server|client`` program on softnic's
              pyverbs API, ``verbs_api`` (synchronous ids, as rdma_server/
              rdma_client), its device set by ``SOFTNIC_DEVICES``, ``_FAULTS``
              and ``_SEED`` as ``softnic exec`` sets them.  Each side
              prints its completions' statuses and its device's counters, so
              every run is checked against the completion the spec gives:
              every completion SUCCESS, except that a SEND whose ACK the peer
              lost may end RETRY_EXC_ERR, after ``retry_cnt`` (7) retries.
``rdma_server``  Debian's rdma_server / rdma_client (rdmacm-utils) under
              ``softnic exec``: both must print ``end 0`` (they count
              completions, not their status); ``rdma_xserver`` likewise.

Each run has its own fault seed (``--faults loss=LOSS --seed N`` on both
devices: both draw the same loss sequence) and its own loopback addresses.  A
run that outlasts ``--timeout`` is a hang.  Prints one line per run with
``-v``, then the runs, the hangs, the outcome counts and the time; ``--json``
writes every run's record.  Exit status 1 if any run hung or failed.

    python tools/teardown_loop.py --runs 200
    python tools/teardown_loop.py --program rdma_server --runs 50 --first-seed 80
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
SOFTNIC = [sys.executable, "-m", "softnic.cli"]
#: what a client prints when it came before its server listened
REFUSED = ("REJECTED", "ECONNREFUSED", "Errno: 111", "error 8", "rdma_connect: ")
#: the counters each side of the pyverbs program reports
COUNTERS = ("timeouts", "retry_exceeded_err", "retry_rnr_exceeded_err", "fault_dropped_loss")
#: the programs' retry_cnt: librdmacm's default (pyverbs' ConnParam's is 5)
RETRY_CNT = 7


# ---------------------------------------------------------------- the program

def program(role: str, addr: str, port: str) -> int:
    """One side of the exchange (run under ``softnic exec``): prints ``wc NAME
    STATUS`` for each completion, then ``counters {...}``, and ends its QP at once."""
    from verbs_api.cmid import CMID, AddrInfo, ConnParam     # (pyverbs' API)
    from verbs_api.qp import QPInitAttr, QPCap
    import verbs_api.cm_enums as ce
    import verbs_api.enums as e
    from softnic.driver import nic

    def report(what, wc):
        print("wc", what, e.ibv_wc_status(wc.status).name, flush=True)

    init = QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(max_send_wr=2, max_recv_wr=2))
    if role == "server":
        listener = CMID(AddrInfo(src=addr, src_service=port, port_space=ce.RDMA_PS_TCP,
                                 flags=ce.RAI_PASSIVE), init)
        listener.listen()
        conn = listener.get_request()
        mr = conn.reg_msgs(64)
        conn.post_recv(mr)
        conn.accept(ConnParam(retry=RETRY_CNT, rnr_retry=7))
        wc = conn.get_recv_comp()
        report("recv", wc)
        msg = mr.read(wc.byte_len, 0)
        mr.write(msg.upper(), len(msg))
        conn.post_send(mr, length=len(msg))
        report("send", conn.get_send_comp())
    else:
        conn = CMID(AddrInfo(dst=addr, dst_service=port, port_space=ce.RDMA_PS_TCP), init)
        mr = conn.reg_msgs(64)
        conn.post_recv(mr)
        conn.connect(ConnParam(retry=RETRY_CNT, rnr_retry=7))
        mr.write(b"teardown", 8)
        conn.post_send(mr, length=8)
        report("send", conn.get_send_comp())
        wc = conn.get_recv_comp()
        report("recv", wc)
        conn.disconnect()             # the QP to ERR the moment the last completion is in
    counters = {}
    for n in nic.open_nics():
        for k in COUNTERS:
            counters[k] = counters.get(k, 0) + n.counters.get(k, 0)
    print("counters", json.dumps(counters), flush=True)
    conn.close()
    if role == "server":
        listener.close()
    return 0


# ---------------------------------------------------------------- the loop

def _addresses(rng: random.Random) -> tuple[str, str]:
    """Two loopback addresses no device on this machine holds (RoCEv2's port free)."""
    while True:
        net = f"127.{rng.randrange(20, 250)}.{rng.randrange(1, 250)}"
        pair = (f"{net}.6", f"{net}.7")
        try:
            for ip in pair:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.bind((ip, 4791))
        except OSError:
            continue
        return pair


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _exec(prog: str, ip: str, seed: int, loss: float, args: list[str]):
    """The command and environment of one side: the C programs under ``softnic
    exec``; the Python program configured by the same variables ``softnic exec``
    sets (one interpreter start fewer)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT)] + ([env["PYTHONPATH"]]
                                                         if env.get("PYTHONPATH") else []))
    if prog == "pyverbs":
        env["SOFTNIC_DEVICES"] = f"softnic0={ip}"
        if loss:
            env["SOFTNIC_FAULTS"], env["SOFTNIC_SEED"] = f"loss={loss}", str(seed)
        return args, env
    cmd = [*SOFTNIC, "exec", "--devices", f"softnic0={ip}"]
    if loss:
        cmd += ["--faults", f"loss={loss}", "--seed", str(seed)]
    return cmd + ["--", *args], env


def _commands(prog: str, sip: str, port: str) -> tuple[list[str], list[str]]:
    if prog == "pyverbs":
        me = [sys.executable, str(Path(__file__).resolve())]
        return [*me, "--role", "server", sip, port], [*me, "--role", "client", sip, port]
    server, client = {"rdma_server": ("rdma_server", "rdma_client"),
                      "rdma_xserver": ("rdma_xserver", "rdma_xclient")}[prog]
    return [server, "-s", sip, "-p", port] if server == "rdma_server" else \
        [server, "-p", port], [client, "-s", sip, "-p", port]


def _listening(proc, ip: str, deadline: float) -> None:
    """Until the server's device has its UDP socket on ``ip`` (port 4791), then a
    moment for its listen."""
    import ipaddress
    want = "%08X:12B7" % int.from_bytes(ipaddress.IPv4Address(ip).packed, "little")
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if any(ln.split()[1] == want
                   for ln in Path("/proc/net/udp").read_text().splitlines()[1:]):
                break
        except OSError:
            pass
        time.sleep(0.1)
    time.sleep(0.5)


def run_once(prog: str, seed: int, loss: float, timeout: float,
             rng: random.Random) -> dict:
    """One run: {"seed", "outcome", "seconds", "server", "client"} (outputs)."""
    sip, cip = _addresses(rng)
    port = _free_port()
    scmd, ccmd = _commands(prog, sip, port)
    t0 = time.monotonic()
    deadline = t0 + timeout
    cmd, env = _exec(prog, sip, seed, loss, scmd)
    srv = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    cout, crc, hung = "", None, False
    try:
        _listening(srv, sip, deadline)
        while True:
            cmd, env = _exec(prog, cip, seed, loss, ccmd)
            try:
                cli = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                     timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as e:
                cout = (e.stdout or b"").decode(errors="replace") if isinstance(
                    e.stdout, bytes) else (e.stdout or "")
                hung = True
                break
            cout, crc = cli.stdout + cli.stderr, cli.returncode
            if crc == 0 or srv.poll() is not None or time.monotonic() > deadline - 5 \
                    or not any(r in cout for r in REFUSED):
                break
            time.sleep(0.3)                     # the server was not listening yet
        try:
            sout, _ = srv.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            srv.kill()
            sout, _ = srv.communicate()
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    rec = {"seed": seed, "seconds": round(time.monotonic() - t0, 2),
           "server": sout, "client": cout, "server_rc": srv.returncode, "client_rc": crc}
    rec["outcome"] = "hang" if hung else classify(prog, rec)
    return rec


def parse_output(out: str) -> tuple[dict, dict]:
    """A pyverbs side's output: ({"send"|"recv": status name}, {counter: value})."""
    wcs, counters = {}, {}
    for ln in out.splitlines():
        f = ln.split(None, 2)
        if len(f) == 3 and f[0] == "wc":
            wcs[f[1]] = f[2]
        elif ln.startswith("counters "):
            counters = json.loads(ln[len("counters "):])
    return wcs, counters


def classify(prog: str, rec: dict) -> str:
    """The outcome the spec allows, or ``failed``."""
    if rec["server_rc"] != 0 or rec["client_rc"] != 0:
        return "failed"
    if prog != "pyverbs":
        name = _commands(prog, "-", "-")
        ok = f"{name[0][0]}: end 0" in rec["server"] and f"{name[1][0]}: end 0" in rec["client"]
        return "ended 0" if ok else "failed"
    sides = [parse_output(rec["server"]), parse_output(rec["client"])]
    ok, exc = "IBV_WC_SUCCESS", "IBV_WC_RETRY_EXC_ERR"
    exceeded = []
    for (wcs, counters), peer in zip(sides, ("client", "server")):
        if wcs.get("recv") != ok or wcs.get("send") not in (ok, exc):
            return "failed"
        if wcs["send"] == ok:
            if counters.get("retry_exceeded_err"):
                return "failed"
            continue
        # the peer lost this SEND's ACK and ended its QP: retry_cnt retries, then
        # the timeout that gives up (and maybe timeouts before, that progress followed)
        if counters.get("retry_exceeded_err") != 1 or counters.get("timeouts", 0) < RETRY_CNT + 1 \
                or not parse_output(rec[peer])[1].get("fault_dropped_loss"):
            return "failed"
        exceeded.append(peer)
    return "success" if not exceeded else "retry exceeded (%s's ACK lost)" % exceeded[0] \
        if len(exceeded) == 1 else "failed"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--program", choices=("pyverbs", "rdma_server", "rdma_xserver"),
                    default="pyverbs")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--seeds", help="comma-separated seeds (instead of --runs/--first-seed)")
    ap.add_argument("--loss", type=float, default=0.02)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a run is a hang")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each its own addresses)")
    ap.add_argument("--json", help="write every run's record here")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--role", choices=("server", "client"), help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        return program(args.role, *args.rest)
    if args.program != "pyverbs" and shutil.which(_commands(args.program, "-", "-")[0][0]) is None:
        print(f"teardown_loop: {args.program} is not installed (Debian: rdmacm-utils)",
              file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else \
        list(range(args.first_seed, args.first_seed + args.runs))
    rng = random.Random()
    records, counts = [], collections.Counter()
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        runs = [pool.submit(run_once, args.program, seed, args.loss, args.timeout,
                            random.Random(rng.random())) for seed in seeds]
        for done in concurrent.futures.as_completed(runs):
            rec = done.result()
            records.append(rec)
            counts[rec["outcome"]] += 1
            seed = rec["seed"]
            if args.verbose or rec["outcome"] in ("hang", "failed"):
                print(f"seed {seed:5d}  {rec['outcome']:<30} {rec['seconds']:6.1f} s", flush=True)
                if rec["outcome"] in ("hang", "failed"):
                    print("  server:", rec["server"].strip().replace("\n", "\n          "))
                    print("  client:", rec["client"].strip().replace("\n", "\n          "))
    records.sort(key=lambda r: r["seed"])
    took = time.monotonic() - t0
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    print(f"program {args.program}, loss {args.loss}, seeds {seeds[0]}..{seeds[-1]}, "
          f"{args.jobs} at a time")
    print(f"runs {len(records)}  hangs {counts['hang']}  "
          + "  ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "hang"))
    print(f"time {took:.1f} s ({took / max(1, len(records)):.1f} s a run), "
          f"Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")
    return 1 if counts["hang"] or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
