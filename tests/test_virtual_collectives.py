"""softnic.collectives ranks in virtual time (softnic.collectives.virtual): the real
Communicator over the pyverbs API on simulated devices of a leaf-spine, run as
cooperative tasks.  Results against numpy, determinism, admission, failures, and the
cluster experiment."""

from __future__ import annotations

import numpy as np
import pytest

import softnic.experiments.cluster as cl
from softnic.collectives import CollectiveError, Communicator
from softnic.collectives.virtual import Deadlock, VirtualCluster, VirtualTransport
from softnic.core.device import DeviceConfig
from softnic.transport.clos import PFC, LeafSpineConfig
from softnic.transport.sim import Fabric


def _cluster(n, *, seed=1, shared=False, leaves=2):
    fabric = Fabric(seed)
    net = fabric.add_leaf_spine(LeafSpineConfig(
        leaves=leaves, hosts_per_leaf=-(-n // leaves), spines=2, host_rate_bps=100e9,
        pfc=PFC()))
    dcfg = DeviceConfig(line_rate_bps=100e9, check_icrc=False, window=64, ack_every=4,
                        min_timer=200e-6, max_qp_wr=1 << 14)
    addrs = [f"10.{r % leaves}.0.{r + 1}" for r in range(n)]
    vc = VirtualCluster(fabric, addrs, dcfg, seed=seed, shared_payload=shared,
                        place=lambda d, r: net.connect(d.address, r % leaves))
    return vc, net


def _every_collective(rank, vc, n, transport=VirtualTransport, **kw):
    t = transport(vc, rank, n, qps=2, **kw)
    c = Communicator(rank, n, vc.store, transport=t)
    out = {}
    try:
        for algo, count in (("ring", 300_001), ("tree", 70_000), ("rd", 17), ("hd", 90_001)):
            x = (np.arange(count, dtype=np.int64) % 1000) * (rank + 1)
            c.allreduce(x, algorithm=algo)
            out[algo] = bool(np.array_equal(x, (np.arange(count) % 1000) * n * (n + 1) // 2))
            out[algo + "_t"] = vc.now
        a = np.arange(n * 1000, dtype=np.int32) + 100_000 * rank
        b = c.alltoall(a)
        out["alltoall"] = all(np.array_equal(b[p * 1000:(p + 1) * 1000],
                                             np.arange(rank * 1000, (rank + 1) * 1000)
                                             + 100_000 * p) for p in range(n))
        g = c.allgather(np.full(3, rank, np.int16))
        out["allgather"] = g.reshape(-1).tolist() == [p for p in range(n) for _ in range(3)]
        rs = c.reduce_scatter(np.arange(n * 5, dtype=np.float64))
        out["reduce_scatter"] = rs.tolist() == [n * float(i) for i in range(rank * 5,
                                                                          rank * 5 + 5)]
        bc = np.full(200_000, rank, np.uint8)
        c.broadcast(bc, root=n - 1)
        out["broadcast"] = bool(np.all(bc == n - 1))
        c.barrier()
        out["end"] = vc.now
    finally:
        c.close()
    return out


@pytest.mark.parametrize("admit", [None, 1])
def test_every_collective_matches_numpy_in_virtual_time(admit):
    n = 5                                   # not a power of two: rd folds, trees are ragged
    vc, _ = _cluster(n)
    res = vc.run(lambda r, vc: _every_collective(r, vc, n, admit=admit))
    for r, out in enumerate(res):
        bad = [k for k, v in out.items() if v is False]
        assert not bad, f"rank {r}: wrong {bad}"
        assert 0 < out["ring_t"] < out["tree_t"] < out["end"] < 0.05   # virtual seconds


@pytest.mark.parametrize("what", ["ring", "tree", "ptree", "rd", "hd", "alltoall"])
def test_connecting_on_use_leaves_a_collective_as_a_full_mesh_runs_it(what):
    """VirtualTransport connects a pair when a call first uses it; a full mesh
    connected at start (as on live devices) gives the same run, event for event, for
    a job's collective (the cluster experiment's case), whichever peers its calls use."""
    n = 6

    class Mesh(VirtualTransport):
        connect_on_use = False

    def prog(rank, vc, transport):
        c = Communicator(rank, n, vc.store, transport=transport(vc, rank, n, qps=2))
        try:
            if what == "alltoall":
                a = np.arange(n * 20_000, dtype=np.int32) + rank
                b = c.alltoall(a)
                ok = all(np.all(b[p * 20_000:(p + 1) * 20_000] ==
                                np.arange(rank * 20_000, (rank + 1) * 20_000) + p)
                         for p in range(n))
            else:
                x = np.arange(200_001, dtype=np.int64) * (rank + 1)
                c.allreduce(x, algorithm=what)
                ok = bool(np.all(x == np.arange(200_001) * n * (n + 1) // 2))
            return ok, vc.now, sorted(vc.flows.items())
        finally:
            c.close()

    runs = []
    for transport in (VirtualTransport, Mesh):
        vc, _ = _cluster(n)
        res = vc.run(lambda r, vc: prog(r, vc, transport))
        assert all(ok for ok, *_ in res)
        runs.append((res, vc.now, vc.fabric.events_processed, vc.fabric.hops_processed))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("on_use", [True, False])
def test_a_ring_connects_its_neighbours_only(on_use):
    n = 8

    class T(VirtualTransport):
        connect_on_use = on_use

    def prog(rank, vc):
        t = T(vc, rank, n, qps=2)
        c = Communicator(rank, n, vc.store, transport=t)
        try:
            x = np.full(4096, rank, np.int32)
            c.allreduce(x, algorithm="ring")
            assert np.all(x == n * (n - 1) // 2)
            return sorted(t.qps), len(t.qp_list)
        finally:
            c.close()

    vc, _ = _cluster(n)
    for rank, (peers, nqp) in enumerate(vc.run(prog)):
        want = sorted({(rank - 1) % n, (rank + 1) % n}) if on_use else \
            [p for p in range(n) if p != rank]
        assert peers == want
        assert nqp == 2 * len(want)


def test_a_run_depends_only_on_its_seed():
    """Twice with greenlets, once with threads handing a lock over: the same run."""
    n = 4

    def prog(rank, vc):
        t = VirtualTransport(vc, rank, n, qps=3)
        c = Communicator(rank, n, vc.store, transport=t)
        x = np.ones(1 << 20, np.float32)
        c.allreduce(x)
        done = vc.now
        c.close()
        return done

    runs = []
    for greenlets in (True, True, False):
        vc, net = _cluster(n)
        vc.greenlets = greenlets
        times = vc.run(prog)
        runs.append((times, vc.fabric.events_processed, vc.fabric.hops_processed,
                     net.uplink_bytes()))
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0][0])) > 1               # ranks finish at their own times


def test_shared_payload_pages_leave_the_timing_unchanged():
    """The collectives never branch on data: ranks whose buffers share pages (values
    meaningless) take exactly the virtual time of ranks with their own memory."""
    base = dict(hosts=8, hosts_per_leaf=4, size=2 << 20, qps=2)
    own = cl.run(cl.ClusterConfig(**base, payload="private"))
    shared = cl.run(cl.ClusterConfig(**base, payload="shared"))
    assert own["summary"]["payload"].startswith("private")
    assert shared["summary"]["payload"] == "shared"
    assert own["summary"]["completion_s"] == shared["summary"]["completion_s"]
    assert own["fct_s"] == shared["fct_s"]
    assert own["summary"]["events"] == shared["summary"]["events"]


@pytest.mark.parametrize("idle", [False, True])
def test_credits_go_back_in_batches_unless_returned_when_idle(idle):
    """Live devices return a receiver's credits in batches of half its ring (each
    return is a SEND and its ACK); ``idle_credits`` returns them whenever the
    receiver has nothing else to do.  Small broadcasts back to back: the root never
    runs short of credits either way, and every result is right."""
    n, calls = 2, 40

    class T(VirtualTransport):
        idle_credits = idle

    posted = []

    def prog(rank, vc):
        t = T(vc, rank, n, qps=1, slots=8)
        real = t._post_credit
        t._post_credit = lambda p, k: (posted.append((rank, k)), real(p, k))
        c = Communicator(rank, n, vc.store, transport=t)
        ok = []
        for i in range(calls):
            x = np.full(256, i if rank == 0 else -1, np.int32)
            c.broadcast(x, root=0)
            ok.append(bool(np.all(x == i)))
        c.close()
        return all(ok)

    vc, _ = _cluster(n, leaves=1)
    assert vc.run(prog) == [True, True]
    mine = [k for r, k in posted if r == 1]
    assert sum(mine) <= calls
    if idle:
        assert len(mine) > calls // 2          # one or two at a time
    else:
        assert mine and all(k >= 4 for k in mine)      # half of the 8 slots at a time
        assert len(mine) <= calls // 4


def _overlap(intervals):
    ev = sorted([(a, 1) for a, b in intervals] + [(b, -1) for a, b in intervals])
    cur = best = 0
    for _, k in ev:
        cur += k
        best = max(best, cur)
    return best


@pytest.mark.parametrize("admit", [None, 1, 2])
def test_admission_bounds_the_senders_a_receiver_takes_at_once(admit):
    n = 6

    def prog(rank, vc):
        t = VirtualTransport(vc, rank, n, qps=1, admit=admit)
        c = Communicator(rank, n, vc.store, transport=t)
        c.alltoall(np.ones(n * (1 << 18), np.int32))
        c.close()

    vc, _ = _cluster(n, leaves=3)
    vc.run(prog)
    most = max(_overlap([(s, e) for (src, dst), (ss, es) in vc.flows.items() if dst == rcv
                         for s, e in zip(ss, es)]) for rcv in range(n))
    assert most == (n - 1 if admit is None else admit)


def test_a_rank_that_waits_forever_is_named():
    vc, _ = _cluster(3)

    def prog(rank, vc):
        if rank == 1:
            vc.store.get("never")
        return rank

    with pytest.raises(Deadlock, match="rank 1 on store key 'never'"):
        vc.run(prog)


def test_a_failing_rank_stops_the_run_with_its_error():
    n = 3
    vc, _ = _cluster(n)

    def prog(rank, vc):
        t = VirtualTransport(vc, rank, n, qps=1, timeout=0.01)
        c = Communicator(rank, n, vc.store, transport=t)
        if rank == 2:
            raise ValueError("rank 2 gives up")
        c.allreduce(np.ones(10, np.float32))   # the others wait on rank 2

    with pytest.raises(ValueError, match="rank 2 gives up"):
        vc.run(prog)


def test_a_collective_that_cannot_progress_times_out_in_virtual_time():
    n = 2
    vc, _ = _cluster(n)

    def prog(rank, vc):
        t = VirtualTransport(vc, rank, n, qps=1, timeout=0.002)
        c = Communicator(rank, n, vc.store, transport=t)
        if rank == 0:
            c.allreduce(np.ones(10, np.float32))   # rank 1 never joins
        else:
            vc.store.get("go")                     # ... and waits on something else

    with pytest.raises(CollectiveError, match=r"rank 0: no progress for 0.002 s of virtual "
                                              r"time waiting on rank\(s\) \[1\]"):
        vc.run(prog)
    assert 0.002 <= vc.now < 0.003


def test_cluster_experiment_runs_the_collectives_and_shows_ecmp_collisions():
    """The experiment runs the collectives' own code; one QP per peer
    collides on the uplinks under ECMP, eight spread (the shape of the Meta paper)."""
    base = dict(hosts=8, hosts_per_leaf=4, spines=4, size=4 << 20, placement="spread")
    one = cl.run(cl.ClusterConfig(**base, qps=1))["summary"]
    eight = cl.run(cl.ClusterConfig(**base, qps=8))["summary"]
    assert one["finished"] and eight["finished"]
    assert one["payload"].startswith("private")       # results checked by every rank
    assert one["uplink_mean_max_over_mean"] > eight["uplink_mean_max_over_mean"]
    assert one["completion_s"] > eight["completion_s"]


@pytest.mark.parametrize("n", [2, 5, 8])
def test_pipelined_tree_allreduce_matches_numpy_and_beats_whole_buffers(n):
    """ptree (the binomial tree pipelined segment by segment) gives every rank the
    sum, bit for bit the same on every rank, and in less virtual time than the
    whole-buffer tree once the buffer is many segments."""
    from softnic.collectives import algorithms
    count = 3 * (algorithms.TREE_SEGMENT // 8) + 777       # 4 segments, the last ragged

    def rank(r, vc):
        t = VirtualTransport(vc, r, n, qps=1)
        c = Communicator(r, n, vc.store, transport=t)
        out = {}
        try:
            for algo in ("tree", "ptree"):
                x = np.sin(np.arange(count, dtype=np.float64) * (r + 1))
                t0 = vc.now
                c.allreduce(x, algorithm=algo)
                out[algo] = x
                out[algo + "_t"] = vc.now - t0
        finally:
            c.close()
        return out

    vc, _ = _cluster(n)
    res = vc.run(rank)
    want = sum(np.sin(np.arange(count, dtype=np.float64) * (r + 1)) for r in range(n))
    for out in res:
        assert np.allclose(out["ptree"], want)
        assert np.array_equal(out["ptree"], res[0]["ptree"])
    if n > 2:
        assert res[0]["ptree_t"] < 0.8 * res[0]["tree_t"], (res[0]["ptree_t"], res[0]["tree_t"])
