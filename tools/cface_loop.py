"""The C face's cost per message, in one process: CPU time, steadier than two.

tools/cface_loop.c, compiled with gcc against libibverbs and run under ``softnic
exec``, sends N messages from one device to another in the same process, one at
a time (a receive posted for a SEND, the post, both CQs polled until the message
completed on both sides), and prints the CPU time of all the process's threads
and the wall time per message.  Both ends, the C face's entries, the engine and
the sockets are in the figure; no second program's scheduling is.  It still
moves with the host's speed (161-165 us per 8256-byte SEND in three runs one
minute, 183-266 in five runs an hour later, pyenv CPython 3.11.7,
2026-12-03), so compare trees alternately in one sitting (``--against``):

    .venv/bin/python tools/cface_loop.py [--op send|write] [-n N] [-s SIZE]
                                         [--against TREE --rounds R]

``--against TREE`` runs the same with the softnic of another checkout, the two
alternating, ``--rounds`` times each, and prints each pair's ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tools" / "cface_loop.c"
LINE = re.compile(r"cface_loop (\w+) (\d+): (\d+) messages, cpu_us ([\d.]+) wall_us ([\d.]+)")


def build(dest: Path) -> Path:
    """The program, compiled (gcc, -libverbs: Debian's libibverbs-dev)."""
    if shutil.which("gcc") is None:
        raise RuntimeError("cface_loop needs gcc")
    exe = dest / "cface_loop"
    r = subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-Wno-unused-function", "-o",
                        str(exe), str(SOURCE), "-libverbs"], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"cface_loop did not build:\n{r.stderr}")
    return exe


def run(exe: Path, tree: Path, op: str, n: int, size: int) -> dict:
    """One run with the softnic of ``tree``: {"cpu_us": ..., "wall_us": ...} per message."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    r = subprocess.run([sys.executable, "-m", "softnic.cli", "exec", "--", str(exe), op,
                        str(n), str(size)], env=env, capture_output=True, text=True,
                       timeout=600)
    m = LINE.search(r.stdout)
    if r.returncode or not m:
        raise RuntimeError(f"cface_loop failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    return {"cpu_us": float(m.group(4)), "wall_us": float(m.group(5))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=("send", "write"), default="send")
    ap.add_argument("-n", type=int, default=5000, help="messages timed (default 5000)")
    ap.add_argument("-s", "--size", type=int, default=8256,
                    help="bytes per message (default 8256: an eager fragment of UCX's)")
    ap.add_argument("--against", type=Path, help="another checkout, run alternately")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each (default 3)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        exe = build(Path(d))
        trees = [ROOT] + ([args.against.resolve()] if args.against else [])
        got: dict[Path, list] = {t: [] for t in trees}
        for k in range(args.rounds if args.against else 1):
            for t in (trees if k % 2 == 0 else trees[::-1]):
                f = run(exe, t, args.op, args.n, args.size)
                got[t].append(f)
                print(f"{t}: {args.op} {args.size} B: cpu {f['cpu_us']:.1f} us, "
                      f"wall {f['wall_us']:.1f} us per message", flush=True)
        if args.against:
            ratios = [a["cpu_us"] / b["cpu_us"] for a, b in zip(got[ROOT], got[trees[1]])]
            each = ", ".join(f"{r:.3f}" for r in ratios)
            print(f"cpu per message, this tree / {trees[1]}: {each}; "
                  f"median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
