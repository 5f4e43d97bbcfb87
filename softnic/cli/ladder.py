"""``softnic trace``: a packet ladder from a pcap or a simulated run, printed
(the ladder itself: ``softnic.trace.ladder``)."""

from __future__ import annotations

import argparse
import sys

from ..wire.roce import ROCEV2_PORT


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``softnic trace``."""
    p.add_argument("pcap", nargs="?", help="a RoCEv2 capture (pcap or pcapng)")
    p.add_argument("--demo", action="store_true",
                   help="simulate an RC WRITE then READ over a lossy link and show its ladder")
    p.add_argument("--loss", type=float, default=0.05, help="loss probability for --demo")
    p.add_argument("--faults", help="full fault model for --demo, e.g. 'loss=0.05,dup=0.01'")
    p.add_argument("--seed", type=int, default=2, help="seed of the --demo run")
    p.add_argument("--mtu", type=int, default=1024, choices=(256, 512, 1024, 2048, 4096))
    p.add_argument("--size", type=int, default=8192, help="bytes written and read by --demo")
    p.add_argument("--drop-request", type=int, action="append", default=[], metavar="N",
                   help="--demo: also lose the N-th datagram (from 0) the requester sends")
    p.add_argument("--drop-response", type=int, action="append", default=[], metavar="N",
                   help="--demo: also lose the N-th datagram (from 0) the responder sends")
    p.add_argument("--port", type=int, default=ROCEV2_PORT,
                   help="UDP destination port of RoCEv2 in the pcap (0: any port)")
    p.add_argument("--max", type=int, default=None, metavar="N", help="show at most N packets")
    p.add_argument("--svg", metavar="PATH", help="also draw the ladder as SVG")
    p.add_argument("--unit", choices=("auto", "us", "ms", "s"), default="auto")
    p.add_argument("--width", type=int, default=36, help="characters between two columns")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")


def main(args: argparse.Namespace) -> int:
    """Run ``softnic trace`` with parsed ``args``."""
    # (here, not at the top: every softnic command builds this subcommand's parser)
    from ..trace.ladder import (
        from_fabric_trace, from_pcap, render_svg, render_text, simulate, summary,
    )
    if args.demo == bool(args.pcap):
        print("softnic trace: give a pcap file or --demo", file=sys.stderr)
        return 2
    labels = None
    if args.demo:
        try:
            run = simulate(loss=args.loss, faults=args.faults, seed=args.seed, mtu=args.mtu,
                           size=args.size, drop_requests=args.drop_request,
                           drop_responses=args.drop_response)
        except ValueError as e:
            print(f"softnic trace: {e}", file=sys.stderr)
            return 2
        events = from_fabric_trace(run.trace)
        labels = run.labels
        title = (f"RC WRITE {args.size} B then READ {args.size} B, path MTU {args.mtu}, "
                 f"faults {run.faults}, seed {run.seed}"
                 + "".join(f", datagram {n} of the {who} lost" for who, ns in
                           (("requester", args.drop_request), ("responder", args.drop_response))
                           for n in ns))
    else:
        try:
            events = from_pcap(args.pcap, port=args.port or None)
        except (OSError, Exception) as e:   # scapy raises its own exception type
            print(f"softnic trace: {args.pcap}: {e}", file=sys.stderr)
            return 1
        title = args.pcap
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print(title)
    sys.stdout.write(render_text(events, max_lines=args.max, unit=args.unit, color=color,
                                 labels=labels, width=args.width))
    print(summary(events))
    if args.svg:
        render_svg(events, args.svg, labels=labels, max_events=args.max, title=title,
                   unit=args.unit)
        print(f"SVG written to {args.svg}")
    if args.demo and not run.ok:
        print("the transfer did not complete", file=sys.stderr)
        return 1
    return 0
