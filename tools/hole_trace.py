#!/usr/bin/env python3
"""Where the repair of a lost packet's hole spends its time, on a live lossy stream.

Runs ``softnic perf write_bw`` (one QP, selective repeat, ``SOFTNIC_FAULTS``
loss on both ends) as server and client on loopback, each process with
timestamps taken at the steps of every hole's repair, and prints, per hole,
the time between consecutive steps:

    NAKQ     the responder queues the NAK naming the missing PSN (``_sack_nak``)
    NAKSENT  that NAK leaves its socket
    NAK      the requester takes it (``completer._sequence_nak``)
    RESEND   the requester builds the resend (``requester._resend_singles``)
    FILL     the responder executes the missing PSN, held packets behind it
    ACKPAST  the requester's cumulative ACK passes the PSN (``completer._progress``)

plus FILL -> ACKSENT (the first ACK at or past the PSN leaves the responder)
and ACKSENT -> ACKPAST.  Both processes read ``time.perf_counter``
(CLOCK_MONOTONIC: one clock for the two).  The hooks wrap the engine's
functions and cost a little time each; compare legs within a run.

    .venv/bin/python tools/hole_trace.py [--loss 0.01] [-n 10000] [--seed 7]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEGS = ("NAKQ", "NAKSENT", "NAK", "RESEND", "FILL", "ACKPAST")


def _hooks(role: str, events: list) -> None:
    """Wrap the engine's steps of a hole's repair on this side (``role``)."""
    import softnic.core.completer as cm
    import softnic.core.requester as rq
    import softnic.core.responder as rm
    from softnic.transport import udp
    from softnic.wire import roce
    from softnic.wire.icrc import ICRC_LEN
    from softnic.wire.psn import psn_diff
    pc = time.perf_counter
    if role == "cli":
        pending: set = set()
        nak, prog, resend = cm._sequence_nak, cm._progress, rq._resend_singles

        def sequence_nak(dev, qp, psn, *a):
            if psn not in pending:
                pending.add(psn)
                events.append(("NAK", psn, pc()))
            return nak(dev, qp, psn, *a)

        def progress(dev, qp, *a):
            r = prog(dev, qp, *a)
            if pending:
                acked, t = qp.comp.acked_psn, pc()
                for p in [p for p in pending if psn_diff(acked, p) >= 0]:
                    pending.discard(p)
                    events.append(("ACKPAST", p, t))
            return r

        def resend_singles(dev, qp, *a):
            items = list(qp.comp.rexmit)
            r = resend(dev, qp, *a)
            t = pc()
            events.extend(("RESEND", it if isinstance(it, int) else it[0], t) for it in items)
            return r
        cm._sequence_nak, cm._progress, rq._resend_singles = sequence_nak, progress, \
            resend_singles
        return
    named: set = set()
    sack, receive = rm._sack_nak, rm.receive

    def sack_nak(dev, qp, missing, held):
        if missing not in named:
            named.add(missing)
            events.append(("NAKQ", missing, pc()))
        return sack(dev, qp, missing, held)

    def fill(dev, qp, pkt, src, now):
        if qp.sr.ooo and pkt.bth.psn == qp.resp.epsn:
            events.append(("FILL", pkt.bth.psn, pc()))
        return receive(dev, qp, pkt, src, now)

    def look(data) -> None:
        if len(data) != 20:                 # BTH + AETH + ICRC: an ACK or a NAK
            return
        pkt = roce.decode(bytes(data[:-ICRC_LEN]))
        if pkt.aeth is not None:
            events.append(("NAKSENT" if pkt.aeth.code is roce.AethCode.NAK else "ACKSENT",
                           pkt.bth.psn, pc()))
    send, runs, batch = udp.UdpSocket.send, udp.UdpSocket.send_runs, udp.UdpSocket.send_batch

    def send_one(self, data, addr):
        look(data)
        return send(self, data, addr)

    def send_runs(self, items):
        for it in items:
            if type(it) is not rq.Run:
                look(it[0])
        return runs(self, items)

    def send_batch(self, items):
        for it in items:
            look(it[0])
        return batch(self, items)
    rm._sack_nak, rm.receive = sack_nak, fill
    udp.UdpSocket.send, udp.UdpSocket.send_runs, udp.UdpSocket.send_batch = \
        send_one, send_runs, send_batch


def _role(role: str, out: str, argv: list[str]) -> int:
    events: list = []
    _hooks(role, events)
    from softnic.cli.main import main
    try:
        rc = main(argv)
    finally:
        Path(out).write_text(json.dumps(events))
    return rc or 0


def _pct(v: list[float], q: float) -> float:
    return v[int(q * (len(v) - 1))]


def analyse(srv: list, cli: list) -> dict[str, list[float]]:
    """Per hole, microseconds between consecutive steps (holes with every step)."""
    from softnic.wire.psn import psn_before
    first: dict[int, dict[str, float]] = {}
    acks = []
    for k, p, t in srv + cli:
        if k == "ACKSENT":
            acks.append((t, p))
        else:
            first.setdefault(p, {}).setdefault(k, t)
    acks.sort()
    legs: dict[str, list[float]] = {}
    for p, e in first.items():
        if not all(k in e for k in LEGS):
            continue
        for a, b in zip(LEGS, LEGS[1:]):
            legs.setdefault(f"{a} -> {b}", []).append((e[b] - e[a]) * 1e6)
        legs.setdefault("NAKQ -> ACKPAST", []).append((e["ACKPAST"] - e["NAKQ"]) * 1e6)
        i = bisect.bisect_left(acks, (e["FILL"], -1))
        while i < len(acks) and psn_before(acks[i][1], p):
            i += 1                        # an ACK below the PSN
        if i < len(acks):
            legs.setdefault("FILL -> ACKSENT", []).append((acks[i][0] - e["FILL"]) * 1e6)
            legs.setdefault("ACKSENT -> ACKPAST", []).append((e["ACKPAST"] - acks[i][0]) * 1e6)
    return {k: sorted(v) for k, v in legs.items()}


def main() -> int:
    if sys.argv[1:2] == ["--role"]:       # a side: --role ROLE --out FILE softnic-args...
        return _role(sys.argv[2], sys.argv[4], sys.argv[5:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loss", type=float, default=0.01)
    ap.add_argument("-n", type=int, default=10000, help="64 KiB WRITEs")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    perf = ["perf", "write_bw", "-s", "65536", "-n", str(args.n), "-m", "4096", "-t", "16",
            "-u", "11", "-p", str(port), "--no-progress"]
    env = dict(os.environ, SOFTNIC_FAULTS=f"loss={args.loss}", SOFTNIC_SEED=str(args.seed),
               SOFTNIC_RECOVERY="sr", PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        files = {r: str(Path(tmp) / f"{r}.json") for r in ("srv", "cli")}
        cmd = [sys.executable, __file__]
        server = subprocess.Popen(cmd + ["--role", "srv", "--out", files["srv"]] + perf,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)
        time.sleep(1.0)
        client = subprocess.run(cmd + ["--role", "cli", "--out", files["cli"]] + perf
                                + ["127.0.0.1"], env=env, capture_output=True, text=True,
                                timeout=600)
        _, err = server.communicate(timeout=60)
        if client.returncode or server.returncode:
            raise SystemExit(f"softnic perf failed:\n{client.stdout}{client.stderr}{err}")
        srv, cli = (json.loads(Path(files[r]).read_text()) for r in ("srv", "cli"))
    row = [ln for ln in client.stdout.splitlines() if ln.split()[:1] == ["65536"]]
    print(f"python {sys.version.split()[0]}; loss {args.loss} both ways, seed {args.seed}, "
          f"{args.n} x 64 KiB, 16 in flight, selective repeat")
    print(row[0].strip() if row else client.stdout)
    legs = analyse(srv, cli)
    n = len(legs.get("NAKQ -> ACKPAST", []))
    print(f"holes traced: {n}")
    for k, v in legs.items():
        print(f"  {k:20s} p10 {_pct(v, .1):7.0f}  p50 {_pct(v, .5):7.0f}  "
              f"p90 {_pct(v, .9):7.0f} us")
    return 0 if n else 1


if __name__ == "__main__":
    sys.exit(main())
