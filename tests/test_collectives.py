"""Collectives over verbs: the store, launch, correctness against numpy for 2, 3, 4 and 8
ranks with and without injected loss, failing ranks, and ``softnic perf allreduce``.

The multi-rank tests start real processes through ``softnic launch`` (each rank its
own device on its own loopback address) and bound every run with a timeout.
"""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from softnic.collectives import Communicator, RankFailure, StoreClient, StoreServer
from softnic.collectives.store import StoreTimeout
from softnic.cli.launch import rank_env

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "collectives_worker.py")
CLI = [sys.executable, "-m", "softnic.cli"]


def run(cmd, timeout=120, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


# ---------------------------------------------------------------------- the store


def test_store_set_get_add_and_timeout():
    server = StoreServer("127.0.0.1", 0)
    host, port = server.address
    a, b = StoreClient(host, port, 0), StoreClient(host, port, 1)
    try:
        a.set("k", b"\x00value")
        assert b.get("k") == b"\x00value"
        assert a.add("n", 2) == 2 and b.add("n", 3) == 5
        assert a.check(["k", "n"]) and not a.check(["k", "missing"])
        t0 = time.monotonic()
        with pytest.raises(StoreTimeout, match="'missing' did not appear within 0.3 s"):
            b.get("missing", timeout=0.3)
        assert time.monotonic() - t0 < 5
        assert a.failed_ranks() == []
    finally:
        a.close()
        b.close()
        server.close()


def test_store_reports_a_rank_whose_connection_drops():
    server = StoreServer("127.0.0.1", 0)
    host, port = server.address
    a, b = StoreClient(host, port, 0), StoreClient(host, port, 3)
    try:
        b._sock.close()                     # rank 3 dies without saying goodbye
        t0 = time.monotonic()
        with pytest.raises(RankFailure, match="rank 3: its connection to the store dropped") \
                as info:
            a.get("never", timeout=30)      # fails at once, not after 30 s
        assert info.value.ranks == [3]
        assert time.monotonic() - t0 < 10
        assert a.failed_ranks() == [3]
    finally:
        a.close()
        server.close()


def test_store_unreachable_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]           # nobody listens here
    with pytest.raises(Exception, match=f"cannot reach the rendezvous store at 127.0.0.1:{port}"):
        StoreClient("127.0.0.1", port, 2, timeout=0.5)


# ---------------------------------------------------------------------- one rank, argument checks


def test_communicator_checks_its_arguments():
    server = StoreServer("127.0.0.1", 0)
    store = StoreClient(*server.address, 0)
    comm = Communicator(0, 1, store, prefix="single")
    try:
        x = np.arange(5, dtype=np.float32)
        assert comm.allreduce(x, "max") is x and list(x) == [0, 1, 2, 3, 4]
        assert comm.allgather(x).shape == (1, 5)
        assert list(comm.reduce_scatter(x, op="min")) == list(x)
        assert list(comm.alltoall(x)) == list(x)
        comm.barrier()
        with pytest.raises(ValueError, match="unknown reduction 'avg'"):
            comm.allreduce(x, "avg")
        with pytest.raises(TypeError, match="dtype object is not supported"):
            comm.allreduce(np.array([1, "a"], dtype=object))
        with pytest.raises(TypeError, match="must be a numpy array"):
            comm.allreduce([1.0, 2.0])
        with pytest.raises(ValueError, match="C-contiguous"):
            comm.allreduce(np.zeros((4, 4))[:, 1])
        with pytest.raises(ValueError, match="root 1 outside 0..0"):
            comm.broadcast(x, root=1)
        with pytest.raises(ValueError, match=r"unknown allreduce algorithm 'bus' \(ring, rd, "
                                             r"hd, tree, ptree\)"):
            comm.allreduce(x, algorithm="bus")
        with pytest.raises(ValueError, match="allgather output has 4 elements, needs 5"):
            comm.allgather(x, np.zeros(4, np.float32))
        with pytest.raises(TypeError, match="dtype float64 differs from float32"):
            comm.alltoall(x, np.zeros(5))
    finally:
        comm.close()
        store.close()
        server.close()


def test_a_message_below_a_slot_is_one_chunk_on_live_devices():
    """``csize``: on softnic's live devices a message up to a slot goes as one chunk
    (``min_chunk`` defaults to the slot), a larger one in slots; with a smaller
    ``min_chunk`` a message is cut into quarters of at least that size."""
    server = StoreServer("127.0.0.1", 0)
    store = StoreClient(*server.address, 0)
    comms = [Communicator(0, 1, store, prefix="cut"),
             Communicator(0, 1, store, prefix="cut64", min_chunk=65536)]
    try:
        t, q = comms[0].transport, comms[1].transport
        assert t.chunk == 1 << 20 and t.min_chunk == 1 << 20
        assert [t.nchunks(n) for n in (1000, 256 << 10, 1 << 20, (4 << 20) + 1)] == \
            [1, 1, 1, 5]
        assert [q.csize(n) for n in (1000, 256 << 10, 1 << 20, 64 << 20)] == \
            [65536, 65536, 256 << 10, 1 << 20]
        assert [q.nchunks(n) for n in (1000, 256 << 10, 1 << 20, 64 << 20)] == [1, 4, 4, 64]
        with pytest.raises(ValueError, match="smallest chunk -1"):
            Communicator(0, 1, store, prefix="bad", min_chunk=-1)
    finally:
        for c in comms:
            c.close()
        store.close()
        server.close()


def test_ranks_cutting_messages_differently_refuse_to_connect():
    """Every rank must cut a message alike and write into its peers' rings at the same
    offsets: a rank whose smallest chunk, chunk or slots differ from a peer's fails to
    connect with an error naming the setting, instead of misplacing data."""
    from softnic.collectives import CollectiveError
    for kw, env in (({"min_chunk": 65536}, "SOFTNIC_COLL_MIN_CHUNK"),
                    ({"chunk": 65536}, "SOFTNIC_COLL_CHUNK"),
                    ({"slots": 4}, "SOFTNIC_COLL_SLOTS"),
                    ({"direct": 65536}, "SOFTNIC_COLL_DIRECT")):
        _, errors = _ranks_as_threads(lambda c: None, {0: {}, 1: kw}, prefix=env, timeout=20)
        assert sorted(errors) == [0, 1], (kw, errors)
        assert all(type(e) is CollectiveError for e in errors.values()), errors
        assert all(f"set {env} alike on every rank" in str(e) for e in errors.values()), errors


def _ranks_as_threads(body, kws: dict, prefix: str = "two", timeout: float = 30):
    """Two ranks as threads of this process, rank r a Communicator made with
    ``kws[r]``, each running ``body(comm)``: their results and their exceptions,
    by rank."""
    import threading
    server = StoreServer("127.0.0.1", 0)
    out, errors = {}, {}

    def rank(r):
        store = StoreClient(*server.address, r)
        try:
            c = Communicator(r, 2, store, prefix=prefix, timeout=timeout, **kws[r])
            try:
                out[r] = body(c)
            finally:
                c.close()
        except Exception as ex:         # reported by the caller, with the rank
            errors[r] = ex
        finally:
            store.close()
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    server.close()
    return out, errors


def _two_ranks(body, **kw):
    """``body(comm)`` on two ranks alike; their results (any exception fails)."""
    out, errors = _ranks_as_threads(body, {0: kw, 1: kw})
    assert not errors, {r: repr(e) for r, e in errors.items()}
    return out


def test_large_copied_receives_land_in_the_callers_memory():
    """A receive of ``direct`` bytes or more that is copied (a broadcast's, an
    allgather's) lands in the caller's registered array: its sender asks where
    (a descriptor per large message) and writes there; a reduction's goes through
    the ring (its descriptor says so).  The data is exact either way; with
    ``direct=0`` no descriptor is sent."""
    n = (3 << 20) // 4 + 5                      # 3 MiB and a bit: several chunks

    def body(c):
        r = c.rank
        b = np.arange(n, dtype=np.float32) * 3 if r == 0 else np.zeros(n, np.float32)
        c.broadcast(b, 0)
        x = np.arange(n, dtype=np.float32) + r
        c.allreduce(x)
        src = np.arange(n // 2, dtype=np.float32) + 1e6 * r
        out = np.empty(n // 2 * 2, np.float32)
        c.allgather(src, out)
        t = c.transport
        return (np.array_equal(b, np.arange(n, dtype=np.float32) * 3),
                np.array_equal(x, 2 * np.arange(n, dtype=np.float32) + 1),
                np.array_equal(out, np.concatenate([np.arange(n // 2, dtype=np.float32) + 1e6 * k
                                                    for k in (0, 1)])),
                t.desc_sent[1 - r], t.desc_used[1 - r], t.direct_recvs)
    for direct, described in ((1 << 20, True), (0, False)):
        res = _two_ranks(body, direct=direct)
        for r in (0, 1):
            bc, ar, ag, sent, used, direct_recvs = res[r]
            assert bc and ar and ag, (direct, r, res[r])
            # the allgather's receive, the allreduce's second half (an allgather of
            # the reduced halves) and rank 1's of the broadcast landed in place; the
            # allreduce's reduction did not
            assert direct_recvs == (r + 2 if direct else 0), (direct, res)
            # each rank received the allreduce's messages and the allgather's; rank 1
            # the broadcast too: a descriptor for each large one, each used by the peer
            assert (sent > 0) == described and (used > 0) == described, (direct, res)
            assert sent == res[1 - r][4]


# ---------------------------------------------------------------------- N ranks against numpy


def _launch_worker(n, *flags, faults=None, timeout=120, env=None):
    cmd = CLI + ["launch", "-n", str(n), "--timeout", "30"]
    if faults:
        cmd += ["--faults", faults, "--seed", "7"]
    res = run(cmd + [WORKER, *flags], timeout=timeout,
              env=dict(os.environ, **env) if env else None)
    assert res.returncode == 0, f"launch -n {n} failed:\n{res.stdout}\n{res.stderr[-4000:]}"
    oks = re.findall(r"rank (\d+) ok (\d+) dropped (\d+) verbs (pyverbs|verbs_api)", res.stdout)
    assert sorted(int(r) for r, *_ in oks) == list(range(n)), res.stdout
    assert len({c for _, c, _, _ in oks}) == 1 and int(oks[0][1]) > 20
    want = "pyverbs" if (env or {}).get("SOFTNIC_VERBS") == "pyverbs" else "verbs_api"
    assert {v for *_, v in oks} == {want}
    return sum(int(d) for _, _, d, _ in oks)


@pytest.mark.parametrize("n, flags, env", [
    (2, (), None),                    # every dtype and op
    (3, (), None),                    # every dtype and op, not a power of two
    # through 'import pyverbs' (softnic's, as 'softnic launch' provides it), as on hardware
    (4, ("--quick",), {"SOFTNIC_VERBS": "pyverbs"}),
    (8, ("--quick",), None),
    # two 4 KiB slots per peer: messages of up to 80 chunks stall on credits all the time
    (2, ("--quick", "--big"), {"SOFTNIC_COLL_SLOTS": "2", "SOFTNIC_COLL_CHUNK": "4096"}),
    # chunks striped over three QPs per peer, taken in order whichever QP brings them
    # (sends of 64 KiB or more from the caller's registered memory, and messages below a
    # slot cut into quarters of at least 4 KiB, as virtual time cuts them)
    (3, ("--quick", "--big"), {"SOFTNIC_COLL_QPS": "3", "SOFTNIC_COLL_CHUNK": "16384",
                               "SOFTNIC_COLL_ZCOPY": "65536", "SOFTNIC_COLL_MIN_CHUNK": "4096"}),
    # receiver-driven admission: credits only from a receiver that admitted the sender,
    # one sender at a time, with small slots so messages span many grants
    (4, ("--quick", "--big"), {"SOFTNIC_COLL_ADMIT": "1", "SOFTNIC_COLL_SLOTS": "2",
                               "SOFTNIC_COLL_CHUNK": "16384"}),
], ids=["2-ranks", "3-ranks", "4-ranks-via-pyverbs", "8-ranks", "2-ranks-tight-credits",
        "3-ranks-3-qps", "4-ranks-admission"])
def test_collectives_match_numpy(n, flags, env):
    assert _launch_worker(n, *flags, env=env) == 0


def test_collectives_use_the_pyverbs_api_only():
    """The data path imports verbs from ``_verbs`` (pyverbs' module names) and nothing of
    softnic's engine, so it runs unchanged on rdma-core's pyverbs."""
    import ast
    pkg = HERE.parent / "softnic" / "collectives"
    for name in ("transport.py", "algorithms.py", "communicator.py", "rendezvous.py",
                 "store.py"):
        tree = ast.parse((pkg / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = "." * node.level + (node.module or "")
            elif isinstance(node, ast.Import):
                mod = ",".join(a.name for a in node.names)
            else:
                continue
            assert "verbs_api" not in mod and "softnic" not in mod and "core" not in mod \
                and "nic" not in mod.split("."), f"{name} imports {mod}"
    verbs = (pkg / "_verbs.py").read_text()
    assert '"pyverbs" if _WANT == "pyverbs" else "verbs_api"' in verbs


@pytest.mark.parametrize("n, faults, flags, env", [
    (2, "loss=0.05", ("--quick",), None),
    # 2 % loss and reordering on every link, the ring and the chain with many chunks,
    # striped over two QPs per peer, sent from the callers' registered memory and
    # received into theirs (direct receives from 64 KiB)
    (4, "loss=0.02,reorder=0.02/300us", ("--quick", "--big"),
     {"SOFTNIC_COLL_QPS": "2", "SOFTNIC_COLL_CHUNK": "32768", "SOFTNIC_COLL_ZCOPY": "65536",
      "SOFTNIC_COLL_DIRECT": "65536"}),
], ids=["2-ranks-loss", "4-ranks-loss-reorder-2-qps"])
def test_collectives_match_numpy_under_loss(n, faults, flags, env):
    dropped = _launch_worker(n, *flags, faults=faults, env=env)
    assert dropped > 0                  # the loss really happened, and was recovered


def test_udp_source_port_follows_the_kernels_rule():
    from softnic.core.entropy import calc_flow_label, udp_sport
    from softnic.collectives.transport import flow_label
    # rdma_get_udp_sport: a given label folds its top 6 bits into the low 14
    assert udp_sport(0xFC001, 5, 6) == 0xC000 | (1 ^ 0x3F)
    assert udp_sport(0x00123, 5, 6) == 0xC123
    # no label: one from the QP numbers (rdma_calc_flow_label)
    fl = (17 * 18) ^ ((17 * 18) >> 20)
    assert calc_flow_label(17, 18) == fl & 0xFFFFF and udp_sport(0, 17, 18) == 0xC000 | fl
    big = calc_flow_label(0xFFFFFF, 0xFFFFFE)
    x = 0xFFFFFF * 0xFFFFFE
    x ^= x >> 20
    x ^= x >> 40
    assert big == x & 0xFFFFF
    # the collectives' labels: non-zero, 14 bits, a different port per QP and direction
    for rank, peer in ((0, 1), (3, 7)):
        labels = [flow_label(rank, peer, q) for q in range(64)] + \
            [flow_label(peer, rank, q) for q in range(64)]
        assert all(0 < fl <= 0x3FFF for fl in labels)
        assert len({udp_sport(fl, 1, 2) for fl in labels}) == 128


SIM_PROG = r"""
import threading, numpy as np
from softnic.collectives import Communicator, StoreServer, StoreClient
from softnic.core.entropy import qp_udp_sport
srv = StoreServer("127.0.0.1", 0)
host, port = srv.address
N, res = 3, {}
def rank(r):
    st = StoreClient(host, port, r)
    c = Communicator(r, N, st, device=f"d{r}", timeout=20, qps=2)
    x = np.full(300_000, float(r + 1), np.float32)
    c.allreduce(x)
    b = np.full(100_000, float(r), np.float64)
    c.broadcast(b, 1)
    g = c.allgather(np.full(10, r, np.int64))
    rs = c.reduce_scatter(np.arange(30, dtype=np.int64))
    ports = {p: [qp_udp_sport(qp._eqp) for qp in c.transport.qps[p]] for p in c.transport.qps}
    res[r] = (bool(np.all(x == 6)), bool(np.all(b == 1)), g.reshape(-1).tolist()[::10],
              rs.tolist(), ports == {p: c.transport.udp_source_ports(p) for p in ports})
    c.close(); st.close()
ts = [threading.Thread(target=rank, args=(r,)) for r in range(N)]
[t.start() for t in ts]; [t.join(60) for t in ts]
for r in range(N):
    print("rank", r, res.get(r))
srv.close()
"""


def test_collectives_run_on_the_simulated_fabric():
    """Under SOFTNIC_BACKEND=sim (the ranks as threads of one process, a device each on
    the simulated fabric), with two QPs per peer whose engine QPs carry the ports."""
    env = dict(os.environ, SOFTNIC_BACKEND="sim",
               SOFTNIC_DEVICES="d0=10.0.0.1,d1=10.0.0.2,d2=10.0.0.3")
    res = run([sys.executable, "-c", SIM_PROG], timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    for r in range(3):
        want = (f"rank {r} (True, True, [0, 1, 2], "
                f"{[3 * (10 * r + i) for i in range(10)]}, True)")
        assert want in res.stdout, res.stdout


# ---------------------------------------------------------------------- failing ranks


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_that_never_arrives_is_named_after_the_timeout():
    port = _port()
    procs = []
    for rank in (0, 1):                 # rank 2 of 3 never starts
        # long enough that rank 1, started after rank 0, arrives in time on a busy machine
        env = rank_env(os.environ, rank, 3, port, timeout=6)
        procs.append(subprocess.Popen([sys.executable, WORKER, "--quick"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
        if rank == 0:                   # rank 1 starts once rank 0 serves the store
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and procs[0].poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
    outs = [p.communicate(timeout=60) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode != 0
        assert "CollectiveError" in err, err
        assert "rank 2 of 3 did not arrive at the rendezvous" in err, err


def test_a_rank_that_dies_is_reported_by_the_others():
    res = run(CLI + ["launch", "-n", "3", "--timeout", "30", WORKER, "--die-after", "3"],
              timeout=90)
    assert res.returncode == 3
    assert "rank 1 exited with status 3" in res.stderr
    # the survivors stop with an error naming the dead rank, well before the 30 s timeout
    assert res.stderr.count("rank(s) [1] left the job") + \
        res.stderr.count("on the connection to rank 1") >= 1, res.stderr[-3000:]


# ---------------------------------------------------------------------- launch and perf


def test_launch_sets_torchrun_environment_and_returns_the_failing_status():
    prog = ("import os, sys; e = os.environ; "
            "sys.stdout.write(' '.join([e['RANK'], e['LOCAL_RANK'], e['WORLD_SIZE'], "
            "e['MASTER_ADDR'], e['MASTER_PORT'], e['SOFTNIC_DEVICES']]) + '\\n'); "
            "sys.stdout.flush(); "
            "import pyverbs; assert pyverbs.SOFTNIC; sys.exit(5 if e['RANK'] == '2' else 0)")
    res = run(CLI + ["launch", "-n", "3", "--", sys.executable, "-c", prog], timeout=60)
    assert res.returncode == 5
    assert "rank 2 exited with status 5" in res.stderr
    rows = sorted(line.split() for line in res.stdout.splitlines())
    assert [r[0] for r in rows] == ["0", "1", "2"] and [r[2] for r in rows] == ["3"] * 3
    assert {r[3] for r in rows} == {"127.0.0.1"} and len({r[4] for r in rows}) == 1
    assert len({r[5] for r in rows}) == 3          # a device of its own per rank


def test_launch_rejects_bad_arguments():
    res = run(CLI + ["launch", "-n", "0", "prog.py"])
    assert res.returncode == 2 and "-n 0 outside" in res.stderr
    res = run(CLI + ["launch", "-n", "2", "--faults", "loss=2", "prog.py"])
    assert res.returncode != 0 and "loss" in res.stderr


def test_perf_allreduce_prints_an_nccl_tests_table():
    res = run(CLI + ["perf", "allreduce", "-n", "2", "-b", "8", "-e", "256K", "-f", "8",
                     "-i", "2", "-d", "float32"], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"#\s+size\s+count\s+type\s+redop\s+time\s+algbw\s+busbw\s+#wrong",
                     res.stdout)
    rows = [line.split() for line in res.stdout.splitlines()
            if line.strip() and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [8, 64, 512, 4096, 32768, 262144]
    for size, count, typ, op, t, algbw, busbw, wrong in rows:
        assert int(count) * 4 == int(size) and typ == "float32" and op == "sum"
        assert float(t) > 0 and float(busbw) == pytest.approx(float(algbw), abs=0.011)
        assert wrong == "0"
    assert "Avg bus bandwidth" in res.stdout and "(MB/s)" in res.stdout


@pytest.mark.parametrize("test, factor", [("allgather", 0.5), ("broadcast", 1.0)])
def test_perf_collectives_compare_with_gloo(test, factor):
    if importlib.util.find_spec("torch") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("torch is required in CI (.ci/run installs torch into .venv)")
        pytest.skip("torch not installed")
    res = run(CLI + ["perf", test, "-n", "2", "-b", "1K", "-e", "512K", "-f", "32",
                     "-i", "2", "--compare", "gloo"], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"#\s+size\s+count\s+type\s+redop\s+time\s+algbw\s+busbw\s+#wrong\s+"
                     r"gloo time\s+busbw\s+softnic/gloo", res.stdout), res.stdout
    rows = [line.split() for line in res.stdout.splitlines()
            if line.strip() and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [1024, 32768]
    for size, count, typ, op, t, algbw, busbw, wrong, gt, gbus, ratio in rows:
        assert op == "none" and wrong == "0"
        # nccl-tests' bus bandwidth: (n-1)/n of algbw for allgather and reduce-scatter
        assert float(busbw) == pytest.approx(float(algbw) * factor, abs=0.011)
        assert float(ratio) == pytest.approx(float(t) / float(gt), rel=0.02, abs=0.011)


def test_perf_reducescatter_counts_wrong_elements_nowhere():
    res = run(CLI + ["perf", "reducescatter", "-n", "3", "-b", "96", "-e", "96K", "-f", "32",
                     "-i", "2", "-d", "int64", "-o", "max"], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line.split() for line in res.stdout.splitlines()
            if line.strip() and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [96, 3072, 98304]
    for size, count, typ, op, t, algbw, busbw, wrong in rows:
        assert typ == "int64" and op == "max" and wrong == "0"
        assert float(busbw) == pytest.approx(float(algbw) * 2 / 3, abs=0.011)


def test_perf_has_a_subcommand_per_test():
    res = run(CLI + ["perf", "--help"])
    assert res.returncode == 0 and "allreduce" in res.stdout
    for test in ("allgather", "reducescatter", "broadcast"):
        assert test in res.stdout
    res = run(CLI + ["perf", "nosuchtest"])
    assert res.returncode == 2 and "invalid choice" in res.stderr
    res = run(CLI + ["perf", "allreduce", "-d", "float128"])
    assert res.returncode == 2 and "datatype 'float128' is not one of int8" in res.stderr


def test_launch_runs_a_module_like_torchrun_m():
    res = run(CLI + ["launch", "-n", "2", "-m", "softnic.collectives.rendezvous"], timeout=60)
    assert res.returncode == 0, res.stderr
    res = run(CLI + ["launch", "-n", "2", "-m", "no_such_module_here"], timeout=60)
    assert res.returncode == 1 and "No module named no_such_module_here" in res.stderr
    assert "rank 0 exited with status 1" in res.stderr or "rank 1 exited with status 1" in \
        res.stderr


def test_rendezvous_from_env_says_what_is_missing():
    from softnic.collectives.rendezvous import from_env
    with pytest.raises(RuntimeError, match="RANK is not set: start the ranks with 'softnic launch"):
        from_env({"WORLD_SIZE": "2", "MASTER_PORT": "1"})
    with pytest.raises(RuntimeError, match="RANK=2 outside 0..WORLD_SIZE-1"):
        from_env({"RANK": "2", "WORLD_SIZE": "2", "MASTER_PORT": "1"})
    with pytest.raises(RuntimeError, match="MASTER_PORT='x' is not an integer"):
        from_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "x"})
