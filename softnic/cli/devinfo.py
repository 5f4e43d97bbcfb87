"""``softnic devinfo``: what ``ibv_devinfo`` prints, read through the pyverbs API."""

from __future__ import annotations

import ipaddress
import socket
import sys

_PORT_STATE = {0: "PORT_NOP", 1: "PORT_DOWN", 2: "PORT_INIT", 3: "PORT_ARMED", 4: "PORT_ACTIVE",
               5: "PORT_ACTIVE_DEFER"}
_ATOMIC = {0: "ATOMIC_NONE", 1: "ATOMIC_HCA", 2: "ATOMIC_GLOB"}
_LINK = {0: "Unknown", 1: "InfiniBand", 2: "Ethernet"}
_MTU = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


def _guid(v: int) -> str:
    """A __be64 GUID as pyverbs returns it, printed like ibv_devinfo (xxxx:xxxx:xxxx:xxxx)."""
    h = int.from_bytes(v.to_bytes(8, sys.byteorder), "big")
    return ":".join(f"{(h >> s) & 0xFFFF:04x}" for s in (48, 32, 16, 0))


def _line(out, indent: int, key: str, value) -> None:
    # ibv_devinfo's alignment: device lines reach 4 tab stops, port lines 3 more than indent
    tabs = max(1, (4 if indent == 1 else 3) - (len(key) + 1) // 8)
    out.append("\t" * indent + f"{key}:" + "\t" * tabs + str(value))


def render(name: str, verbose: bool = False) -> str:
    from verbs_api.device import Context
    out: list[str] = []
    with Context(name=name) as ctx:
        a = ctx.query_device()
        out.append(f"hca_id:\t{name}")
        iwarp = getattr(ctx.nic, "transport", "udp") == "tcp"
        _line(out, 1, "transport", "iWARP (1)" if iwarp else "InfiniBand (0)")
        _line(out, 1, "fw_ver", a.fw_version)
        _line(out, 1, "node_guid", _guid(a.node_guid))
        _line(out, 1, "sys_image_guid", _guid(a.sys_image_guid))
        _line(out, 1, "vendor_id", f"{a.vendor_id:#x}")
        _line(out, 1, "vendor_part_id", a.vendor_part_id)
        _line(out, 1, "hw_ver", f"{a.hw_ver:#x}")
        _line(out, 1, "phys_port_cnt", a.phys_port_cnt)
        if verbose:
            for k in ("max_mr_size", "page_size_cap"):
                _line(out, 1, k, f"{getattr(a, k):#x}")
            for k in ("max_qp", "max_qp_wr"):
                _line(out, 1, k, getattr(a, k))
            _line(out, 1, "device_cap_flags", f"{a.device_cap_flags:#010x}")
            for k in ("max_sge", "max_sge_rd", "max_cq", "max_cqe", "max_mr", "max_pd",
                      "max_qp_rd_atom", "max_ee_rd_atom", "max_res_rd_atom",
                      "max_qp_init_rd_atom", "max_ee_init_rd_atom"):
                _line(out, 1, k, getattr(a, k))
            _line(out, 1, "atomic_cap", f"{_ATOMIC.get(a.atomic_caps, '?')} ({a.atomic_caps})")
            for k in ("max_ee", "max_rdd", "max_mw", "max_raw_ipv6_qps", "max_raw_ethy_qp",
                      "max_mcast_grp", "max_mcast_qp_attach", "max_total_mcast_qp_attach",
                      "max_ah", "max_fmr", "max_srq", "max_srq_wr", "max_srq_sge", "max_pkeys",
                      "local_ca_ack_delay"):
                _line(out, 1, k.replace("max_raw_ipv6_qps", "max_raw_ipv6_qp"), getattr(a, k))
        for port in range(1, a.phys_port_cnt + 1):
            p = ctx.query_port(port)
            out.append(f"\t\tport:\t{port}")
            _line(out, 3, "state", f"{_PORT_STATE.get(p.state, '?')} ({p.state})")
            _line(out, 3, "max_mtu", f"{_MTU.get(p.max_mtu, '?')} ({p.max_mtu})")
            _line(out, 3, "active_mtu", f"{_MTU.get(p.active_mtu, '?')} ({p.active_mtu})")
            _line(out, 3, "sm_lid", p.sm_lid)
            _line(out, 3, "port_lid", p.lid)
            _line(out, 3, "port_lmc", f"{p.lmc:#04x}")
            _line(out, 3, "link_layer", _LINK.get(p.link_layer, "Unknown"))
            if verbose:
                _line(out, 3, "max_msg_sz", f"{p.max_msg_sz:#x}")
                _line(out, 3, "port_cap_flags", f"{p.port_cap_flags:#010x}")
                for k in ("max_vl_num", "bad_pkey_cntr", "qkey_viol_cntr", "sm_sl",
                          "pkey_tbl_len", "gid_tbl_len", "subnet_timeout", "init_type_reply",
                          "active_width", "active_speed", "phys_state"):
                    _line(out, 3, k, getattr(p, k))
                gid = ipaddress.IPv6Address(str(ctx.query_gid(port, 0))).packed
                _line(out, 3, "GID[  0]", f"{socket.inet_ntop(socket.AF_INET6, gid)}, RoCE v2")
        out.append("")
    return "\n".join(out)


def main(device: str | None = None, verbose: bool = False) -> int:
    import softnic.driver.nic as nic
    names = nic.device_names()
    if device is not None:
        if device not in names:
            print(f"softnic devinfo: no device {device!r} (devices: {', '.join(names)})",
                  file=sys.stderr)
            return 1
        names = [device]
    for n in names:
        print(render(n, verbose))
    return 0
