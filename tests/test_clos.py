"""The simulated leaf-spine (softnic.transport.clos): ECMP, PFC, and the cluster
experiment's collectives on it (small, deterministic, seeded runs)."""

from __future__ import annotations

import json

import pytest

from softnic.experiments import cluster as cl
from softnic.cli import main
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import SendWR
from softnic.experiments.rig import connect
from softnic.transport.clos import PFC, LeafSpineConfig, headroom_for
from softnic.transport.sim import Fabric


def _fabric(seed=1, **kw):
    cfg = dict(leaves=2, hosts_per_leaf=4, spines=2, host_rate_bps=25e9, buffer_bytes=200_000)
    cfg.update(kw)
    f = Fabric(seed)
    net = f.add_leaf_spine(LeafSpineConfig(**cfg))
    devs = []
    for i in range(cfg["leaves"] * cfg["hosts_per_leaf"]):
        d = Device(f"h{i}", f"10.0.{i // cfg['hosts_per_leaf']}.{i % cfg['hosts_per_leaf'] + 1}",
                   config=DeviceConfig(check_icrc=False))
        f.attach(d)
        net.connect(d.address)
        devs.append(d)
    return f, net, devs


def _writes(f, devs, pairs, nbytes=1 << 20, qps=1):
    """One WRITE of ``nbytes`` on each of ``qps`` QPs per (src, dst); run to the end."""
    eps = []
    for s, d in pairs:
        for _ in range(qps):
            ea, eb = connect(devs[s], devs[d], mtu=4096, timeout=10, endpoint_args=dict(
                buf_size=nbytes, max_send_wr=4, cq_depth=16))
            devs[s].post_send(ea.qp, SendWR(0, W.RDMA_WRITE, [ea.sge(0, nbytes)],
                                            SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                            rkey=eb.mr.rkey))
            eps.append((devs[s], ea))
    got = []

    def done():
        for dev, ea in eps:
            got.extend(dev.poll_cq(ea.send_cq, 4))
        return len(got) == len(eps)

    f.run(until=1.0, stop=done)
    assert len(got) == len(eps) and all(w.status == WCStatus.SUCCESS for w in got)
    return f.now


@pytest.mark.parametrize("interval", [10e-6, None])
def test_queue_samples_are_kept_only_when_asked(interval):
    """Each switch port samples its queue at most every ``sample_interval``; None keeps
    none (the cluster experiment, which samples what it plots itself), and the
    transfers take the same time either way."""
    f, net, devs = _fabric(sample_interval=interval)
    end = _writes(f, devs, [(0, 4), (1, 4), (2, 4)])
    samples = [p.samples for _, p in net.ports()]
    if interval is None:
        assert not any(samples)
    else:
        port = net.leaves[1].down[devs[4].address]
        assert len(port.samples) > 10
        assert all(b[0] - a[0] >= interval * (1 - 1e-9)
                   for a, b in zip(port.samples, port.samples[1:]))
    f2, _, devs2 = _fabric(sample_interval=10e-6 if interval is None else None)
    assert _writes(f2, devs2, [(0, 4), (1, 4), (2, 4)]) == end


def test_config_errors():
    with pytest.raises(ValueError, match="routing"):
        LeafSpineConfig(routing="random")
    with pytest.raises(ValueError, match="xon <= xoff"):
        PFC(xoff=10_000, xon=20_000)
    with pytest.raises(ValueError, match="spines"):
        LeafSpineConfig(spines=0)
    f, net, devs = _fabric(leaves=1, hosts_per_leaf=2)
    extra = Device("x", "10.9.9.9", config=DeviceConfig())
    f.attach(extra)
    with pytest.raises(ValueError, match="already has 2 hosts"):
        net.connect(extra.address, 0)
    with pytest.raises(ValueError, match="no leaf 3"):
        net.connect(extra.address, 3)
    with pytest.raises(ValueError, match="already connected"):
        net.connect(devs[0].address, 0)
    assert LeafSpineConfig(hosts_per_leaf=8, spines=2).oversubscription == 4


def test_ecmp_keeps_a_qp_on_one_path_and_spreads_qps():
    # one QP from leaf 0 to leaf 1: all of its data crosses exactly one spine
    f, net, devs = _fabric(spines=4)
    _writes(f, devs, [(0, 4)])
    up = net.uplink_bytes()["leaf0"]
    assert sum(1 for b in up if b > 500_000) == 1
    # 16 QPs between the same two hosts: the per-QP entropy spreads them
    f, net, devs = _fabric(spines=4)
    _writes(f, devs, [(0, 4)], nbytes=256 << 10, qps=16)
    up = net.uplink_bytes()["leaf0"]
    assert sum(1 for b in up if b > 200_000) >= 3
    # traffic within a leaf never goes up
    f, net, devs = _fabric(spines=4)
    _writes(f, devs, [(0, 1)])
    assert sum(net.uplink_bytes()["leaf0"]) == 0


def test_the_entropy_is_the_qps_udp_source_port():
    from softnic.core.entropy import qp_udp_sport
    from softnic.transport.clos import _udp_sport
    f, net, devs = _fabric()
    ea, eb = connect(devs[0], devs[4], mtu=4096)
    # the requester's data and the responder's ACKs: each side's own QP's port
    assert _udp_sport(devs[0], devs[4].address, eb.qp.qpn) == qp_udp_sport(ea.qp)
    assert _udp_sport(devs[4], devs[0].address, ea.qp.qpn) == qp_udp_sport(eb.qp)
    assert 0xC000 <= qp_udp_sport(ea.qp) <= 0xFFFF


def test_the_entropy_index_answers_as_the_walk_over_the_qps():
    # the fabric keeps an index of each device's QPs for the UDP source port of a new
    # flow; it must answer as a walk over the QPs does, through QPs connected after it
    # was filled, a QP destroyed, and a datagram of no known QP
    from softnic.core.entropy import qp_udp_sport, udp_sport
    from softnic.transport.clos import _udp_sport
    f, net, devs = _fabric()
    index: dict = {}
    ea, eb = connect(devs[0], devs[4], mtu=4096)
    assert _udp_sport(devs[0], devs[4].address, eb.qp.qpn, index) == qp_udp_sport(ea.qp)
    assert len(index) == 1
    later = [connect(devs[0], devs[d], mtu=4096) for d in (5, 6, 5)]
    for a, b in later:          # each a miss first: the index is filled again
        want = qp_udp_sport(a.qp)
        assert _udp_sport(devs[0], b.dev.address, b.qp.qpn, index) == want
        assert _udp_sport(devs[0], b.dev.address, b.qp.qpn) == want
    assert len(index) == 4
    a, b = later[0]
    devs[0].destroy_qp(a.qp)
    assert _udp_sport(devs[0], b.dev.address, b.qp.qpn, index) == udp_sport(0, 0, b.qp.qpn)
    assert _udp_sport(devs[0], devs[4].address, 0xABCDE, index) == udp_sport(0, 0, 0xABCDE)


def test_spray_uses_every_spine_for_one_flow():
    f, net, devs = _fabric(spines=4, routing="spray")
    _writes(f, devs, [(0, 4)], nbytes=256 << 10)
    up = net.uplink_bytes()["leaf0"]
    assert all(b > 256_000 / 4 * 0.6 for b in up)


def test_pfc_is_lossless_where_lossy_drops():
    pairs = [(s, 0) for s in (4, 5, 6, 7)]          # 4:1 across the spines
    f, net, devs = _fabric(buffer_bytes=100_000)
    t_lossy = _writes(f, devs, pairs)
    lossy = net.port_stats(f.now)
    assert sum(p["dropped"] for p in lossy.values()) > 0
    assert net.pause_frames_sent() == 0
    f, net, devs = _fabric(buffer_bytes=100_000, pfc=PFC())
    t_pfc = _writes(f, devs, pairs)
    st = net.port_stats(f.now)
    assert sum(p["dropped"] + p["headroom_drops"] for p in st.values()) == 0
    assert net.pause_frames_sent() > 0
    assert sum(d.counters["retransmitted_pkts"] for d in devs) == 0
    # pauses reached the senders' NICs through the spines, and every paused
    # port was resumed (nothing is left paused when the fabric is idle)
    assert any(p["pauses_rx"] for n, p in st.items() if n.startswith("nic 10.0.1."))
    assert any(p["paused_s"] > 0 for n, p in st.items() if n.startswith("spine"))
    assert all(p["pauses_rx"] == p["resumes_rx"] for p in st.values())
    # 4 MiB through one 25 Gbit/s port: near line rate, faster than lossy
    assert t_pfc < t_lossy
    assert t_pfc < 1.15 * (4 << 20) * 8 / 25e9 * 4168 / 4096


def test_headroom_too_small_is_counted():
    f, net, devs = _fabric(pfc=PFC(xoff=20_000, xon=10_000, headroom=0))
    pairs = [(s, 0) for s in (4, 5, 6, 7)]
    eps = []
    for s, d in pairs:
        ea, eb = connect(devs[s], devs[d], mtu=4096, timeout=10, endpoint_args=dict(
            buf_size=1 << 20, max_send_wr=4, cq_depth=16))
        devs[s].post_send(ea.qp, SendWR(0, W.RDMA_WRITE, [ea.sge(0, 1 << 20)],
                                        SendFlags.SIGNALED, remote_addr=eb.buf.addr,
                                        rkey=eb.mr.rkey))
    f.run(until=2e-3)
    st = net.port_stats(f.now)
    assert sum(p["headroom_drops"] for p in st.values()) > 0
    # the default headroom covers two propagation delays and two packets
    assert headroom_for(25e9, 1e-6) == int(2 * 1e-6 * 25e9 / 8 + 2 * 4168 + 84) + 1


def test_cluster_config_errors():
    with pytest.raises(ValueError, match="mode"):
        cl.ClusterConfig(mode="pfc")
    with pytest.raises(ValueError, match="algorithm"):
        cl.ClusterConfig(algorithm="butterfly")


def test_smooth_rate_is_a_sliding_window():
    times = [i * 1e-6 for i in range(1, 101)]
    cum = [t * 1e9 / 8 for t in times]            # 1 Gbit/s exactly
    r = cl.smooth_rate(times, cum, 10e-6)
    assert r[-1] == pytest.approx(1.0)
    assert r[50] == pytest.approx(1.0)


def test_victim_is_slowed_by_pfc_only(tmp_path):
    lossy = cl.victim(cl.VictimConfig(mode="lossy", duration=0.6e-3))["summary"]
    pfc = cl.victim(cl.VictimConfig(mode="lossless", duration=0.6e-3))["summary"]
    assert lossy["victim_gbps"] > 90 and lossy["pause_frames"] == 0
    assert lossy["switch_drops"] > 0
    assert pfc["switch_drops"] == 0 and pfc["pause_frames"] > 0
    assert pfc["victim_gbps"] < 0.5 * lossy["victim_gbps"]
    assert pfc["paused_s"]["leaf0->spine0"] > 0.2e-3


def test_cluster_cli_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "res"
    assert main(["experiment", "cluster", "--hosts", "4", "--hosts-per-leaf", "2",
                 "--size", "256KiB", "--qps", "2", "--out", str(out), "--no-progress"]) == 0
    res = json.loads((out / "cluster-single.json").read_text())
    assert res["summary"]["finished"] and res["config"]["qps"] == 2
    assert (out / "cluster-single.png").read_bytes()[:4] == b"\x89PNG"
    assert "completion" in capsys.readouterr().out
    assert main(["experiment", "cluster", "--study", "admission", "--hosts", "4",
                 "--hosts-per-leaf", "2", "--size", "128KiB", "--out", str(out),
                 "--no-progress"]) == 0
    st = json.loads((out / "cluster-admission.json").read_text())
    assert [r["variant"] for r in st["rows"]][:2] == ["no admission", "admission, 1 grant"]
    assert (out / "cluster-admission.png").stat().st_size > 10_000
    assert main(["experiment", "cluster", "--hosts", "5", "--hosts-per-leaf", "2",
                 "--out", str(out), "--no-progress"]) == 2
