"""The simulator's zero-ICRC option (``DeviceConfig(icrc=False)``): the same run
where nothing corrupts and nobody checks, refused where it could matter."""

from __future__ import annotations

import json

import pytest

from softnic.experiments import cluster as cl
from softnic.experiments import bottleneck as ex
from softnic.core.device import Device, DeviceConfig
from softnic.core.enums import SendFlags, WCStatus, WROpcode as W
from softnic.core.qp import SendWR
from softnic.experiments.rig import connect
from softnic.driver.faults import FaultModel
from softnic.transport.sim import Fabric


def _computed_icrc(module, monkeypatch):
    """Make ``module`` build its devices with ICRCs computed (icrc=True)."""
    real = DeviceConfig
    monkeypatch.setattr(module, "DeviceConfig", lambda **kw: real(**{**kw, "icrc": True}))


def _strip(res):
    """A result without its wall-clock figures."""
    if isinstance(res, dict):
        return {k: _strip(v) for k, v in res.items()
                if not any(w in k for w in ("wall", "per_s", "cpu"))}
    if isinstance(res, list):
        return [_strip(v) for v in res]
    return res


def test_incast_identical_with_zero_icrc(monkeypatch):
    cfg = ex.IncastConfig(cc="dcqcn", senders=4, rate_gbps=25.0, duration=0.002)
    fast = _strip(ex.incast(cfg))
    _computed_icrc(ex, monkeypatch)
    full = _strip(ex.incast(cfg))
    assert fast["summary"]["events"] > 1000
    assert json.dumps(fast, sort_keys=True, default=str) == \
        json.dumps(full, sort_keys=True, default=str)


def test_cluster_identical_with_zero_icrc(monkeypatch):
    cfg = cl.ClusterConfig(hosts=8, hosts_per_leaf=4, spines=2, collective="allreduce",
                           algorithm="ring", size=256 << 10, qps=2, mode="lossless",
                           cc="dcqcn")
    fast = _strip(cl.run(cfg))
    _computed_icrc(cl, monkeypatch)
    full = _strip(cl.run(cfg))
    assert fast["summary"]["finished"]
    assert json.dumps(fast, sort_keys=True, default=str) == \
        json.dumps(full, sort_keys=True, default=str)


def _pair(fabric, *, icrc=False, check_icrc=False):
    a = Device("a", "10.0.0.1", config=DeviceConfig(icrc=icrc, check_icrc=False))
    b = Device("b", "10.0.0.2", config=DeviceConfig(icrc=True, check_icrc=check_icrc))
    fabric.attach(a)
    fabric.attach(b)
    return a, b


def _write(fabric, a, b, nbytes=100):
    ea, eb = connect(a, b, mtu=1024, timeout=10, endpoint_args=dict(buf_size=4096))
    a.post_send(ea.qp, SendWR(1, W.RDMA_WRITE, [ea.sge(0, nbytes)], SendFlags.SIGNALED,
                              remote_addr=eb.buf.addr, rkey=eb.mr.rkey))
    fabric.run(until=0.01)
    return a.poll_cq(ea.send_cq, 4)


def test_zero_icrc_bytes_are_zeros_and_the_rest_identical():
    packets = {}
    for icrc in (True, False):
        f = Fabric(3, trace=True)
        a, b = _pair(f, icrc=icrc)
        wcs = _write(f, a, b)
        assert [w.status for w in wcs] == [WCStatus.SUCCESS]
        packets[icrc] = [r.data for r in f.trace if r.kind == "send" and r.src == a.address]
    assert packets[False] and len(packets[False]) == len(packets[True])
    for full, zero in zip(packets[True], packets[False]):
        assert bytes(zero[-4:]) == b"\0\0\0\0" and bytes(full[-4:]) != b"\0\0\0\0"
        # the BTH and the payload (a RETH's address and key are the run's buffer's)
        assert len(zero) == len(full) and bytes(zero[:12]) == bytes(full[:12])
        assert bytes(zero[28:-4]) == bytes(full[28:-4])


def test_zero_icrc_refused_on_a_corrupting_link():
    f = Fabric(1, default_faults=FaultModel(corrupt=0.5))
    a, b = _pair(f)
    with pytest.raises(ValueError, match="corrupts"):
        _write(f, a, b)


def test_zero_icrc_refused_toward_a_checking_receiver():
    f = Fabric(1)
    a, b = _pair(f, check_icrc=True)
    with pytest.raises(ValueError, match="checks ICRCs"):
        _write(f, a, b)
    # through a switch too
    f = Fabric(1)
    a, b = _pair(f, check_icrc=True)
    sw = f.add_switch("sw")
    f.connect(a.address, sw, rate_bps=25e9)
    f.connect(b.address, sw, rate_bps=25e9)
    with pytest.raises(ValueError, match="checks ICRCs"):
        _write(f, a, b)
