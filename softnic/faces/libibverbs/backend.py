"""The Python side of softnic's libibverbs.so.1: the sn_* calls of callbacks.h.

The C side hands over flat records (api.h) and small integer handles; this
module keeps the objects behind the handles and drives the same live NICs the
pyverbs-compatible API uses (``softnic.driver.nic``), so a C program and a Python
program are peers on one engine.  Every call returns 0 or a positive errno,
as libibverbs does; an unexpected exception is printed and becomes EIO
(``softnic.faces.externs``).  The calls are plain module functions, grouped by
the object they act on: devices and contexts, PDs, MRs, MWs, AHs, CQs, SRQs,
QPs, XRC.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import os
import struct
import time as _time
import sys
from functools import partial

import softnic
import softnic.driver.nic as _nic
from softnic.driver import env
from softnic.core import xrc
from softnic.core.cq import CQOverflow
from softnic.core.device import port_speed
from softnic.core.enums import Access, QPState, QPType, SendFlags, WCFlags, WROpcode
from softnic.core.errors import VerbsError
from softnic.driver import mcast as _mcast
from softnic.core.memory import IMPLICIT_LENGTH, MR as _EngineMR, PD as _EnginePD, external_device_memory
from softnic.core.qp import AHAttr, QPAttr, QPCap, QPInitAttr, RecvWR, SendWQE, SendWR
from softnic.core.srq import SRQ, RecvWQE
from softnic.core.verbs import Verbs
from softnic.core.wr_opcode import ATOMICS, MAY_INLINE, RD_ATOMIC
from verbs_api.addr import GID_POPULATED, GID_TABLE_LEN
from verbs_api.device import DEVICE_CAP_FLAGS

from ..externs import Externs

_WC_GRH = int(WCFlags.GRH)              # (plain ints: IntFlag's & costs a microsecond)
_WC_WITH_INV = int(WCFlags.WITH_INV)
_SL_IPV4 = 2                 # RoCE L3 header type IPv4 (mlx5's CQE sl for RoCE UD receives)
_SL_IPV6 = 1                 # ... IPv6 (MLX5_CQE_ROCE_L3_HEADER_TYPE_IPV6)
#: the order ``_write_wcs`` gives api.h's struct sn_wc its fields in (its layout, sizes
#: and padding are read from the struct the C side was built with: ``_wc_struct``)
_WC_FIELDS = ("wr_id", "status", "opcode", "vendor_err", "byte_len", "imm_data", "qp_num",
              "src_qp", "wc_flags", "pkey_index", "slid", "sl", "dlid_path_bits")
_INT_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}
_wc: struct.Struct | None = None       # install(): _wc_struct of the embedded module's ffi
#: install(): the compiled post of a chain's records (``_records_post``), or None
_post_records = None
#: the WR opcodes it takes (the rest are ``Verbs.post_send``'s alone)
_FAST_POST = (WROpcode.RDMA_WRITE, WROpcode.RDMA_WRITE_WITH_IMM, WROpcode.SEND,
              WROpcode.SEND_WITH_IMM, WROpcode.RDMA_READ, WROpcode.ATOMIC_CMP_AND_SWP,
              WROpcode.ATOMIC_FETCH_AND_ADD, WROpcode.SEND_WITH_INV)
#: the fields of api.h's struct sn_send_wr, in the order post.c lays them out
_SEND_WR_FIELDS = ("wr_id", "sg_list", "num_sge", "opcode", "send_flags", "imm_data",
                   "invalidate_rkey", "remote_addr", "rkey", "compare_add", "swap", "ah",
                   "remote_qpn", "remote_qkey")
_VERBS_POST_SEND = Verbs.post_send
_VERBS_POST_RECV, _VERBS_POST_SRQ_RECV, _SRQ_POST = Verbs.post_recv, Verbs.post_srq_recv, SRQ.post
#: install(): the compiled post of a chain's receive records (``_records_post``), or None
_post_recvs = None
_RECV_WR_FIELDS = ("wr_id", "sg_list", "num_sge")
#: the QP states ``Verbs.post_recv`` posts a receive in as it is (not RESET, not ERR)
_RECEIVING = (QPState.INIT, QPState.RTR, QPState.RTS, QPState.SQD)
_MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
_ONE = (1).to_bytes(8, sys.byteorder)          # an eventfd increment
#: receives an ``ibv_poll_cq``'s inline step may take while more wait.  A C program
#: that polls its CQ reacts to completions only: a request of the peer's landing
#: just ahead of the ACK it polls for (``ib_write_lat``: the peer's WRITE, then the
#: ACK of ours that the WRITE carried out behind it) is taken with that ACK, in one
#: call.  (A program spinning on memory reacts to the request itself: the Python
#: face's ``poll`` keeps one, and ``softnic perf write_lat`` answers before the ACK.
#: A program's first poll of a CQ it armed since its last one comes before it sleeps
#: on its channel, and keeps one.)  Sixteen, not two: a rank of an exchange (an
#: allreduce's eager fragments, sixteen 8 KiB SENDs each way at 256 KiB) takes the
#: peer's burst in one call, not one call per two fragments, each with its own
#: entry and flush (its requests held by its posts leave before the step receives,
#: ``NIC.poll``; a stream's ACKs leave at half a window within the step, ``_step``;
#: docs/performance.md, "Held posts leave before the poll receives").
POLL_RUNS = env.number("SOFTNIC_POLL_RUNS", 16)

_objs: dict[int, object] = {}
_inherited: set[int] = set()      # handles of the parent's objects, in a forked child
_ids = itertools.count(1)


class _Obj:
    """What a handle names: the NIC it lives on and the engine object."""
    __slots__ = ("nic", "ctx", "eng", "cookie", "channel", "taken", "cqs", "closed",
                 "sleeper", "mirror")

    def __init__(self, nic, eng=None, ctx=None, cookie=None):
        self.nic = nic
        self.eng = eng
        self.ctx = ctx
        self.cookie = cookie
        self.channel = None
        self.taken = 0
        self.cqs: list = []
        self.closed = False
        self.sleeper = False      # a channel: ibv_get_cq_event sleeps on the socket for it
        self.mirror = None        # a CQ: the engine's view of it for shim.c (sn_cq_fastpoll)


_xrcd_files: dict = {}     # (device, st_dev, st_ino) -> [XRC domain, openers]

def _new(obj) -> int:
    h = next(_ids) & 0xFFFFFFFF
    _objs[h] = obj
    return h


def _get(h: int) -> _Obj:
    try:
        return _objs[h]
    except KeyError:
        if h in _inherited:
            raise VerbsError(errno.EIO, "an object of the parent process (this process "
                             "was forked after its parent opened a device)") from None
        raise VerbsError(errno.EINVAL, f"no object with handle {h}") from None


def _gid_bytes(gid: str) -> bytes:
    ip = ipaddress.ip_address(gid)
    if isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address("::ffff:" + str(ip))
    return ip.packed


def _engine_ah(a) -> AHAttr:
    if not a.is_global:
        raise VerbsError(errno.EINVAL, "a RoCE address vector needs a GRH (is_global=1)")
    if a.port_num not in (0, 1):
        raise VerbsError(errno.EINVAL, f"port {a.port_num} does not exist")
    if a.sgid_index >= GID_POPULATED:
        raise VerbsError(errno.EINVAL, f"sgid_index {a.sgid_index} is not a GID of the port")
    dgid = str(ipaddress.IPv6Address(bytes(a.dgid)))
    ah = AHAttr(dgid=dgid, port=_nic.port_for_gid(dgid), sl=a.sl,
                traffic_class=a.traffic_class, hop_limit=a.hop_limit,
                flow_label=a.flow_label, sgid_index=a.sgid_index, port_num=a.port_num or 1)
    ah.addr                     # EINVAL for a GID that names no peer (::, link-local)
    return ah


#: Longest a destroyed RC QP lingers (seconds).
LINGER_MAX = 2.0


def _linger(nic, qp) -> None:
    """Before an RC QP that is connected goes away, wait until the device has received
    nothing for two retransmission timeouts (at most LINGER_MAX in all), answering
    what comes meanwhile.  Programs tear down as soon as their last completion
    arrives; if the ACK of the peer's last request was lost, only this QP can repeat
    it when the peer retransmits (what TCP's TIME_WAIT is for).  The program's memory
    is still registered while the QP lingers: programs deregister after destroying."""
    if qp.qp_type != QPType.RC or qp.state not in (QPState.RTS, QPState.SQD):
        return
    with nic.lock:
        quiet = min(2 * nic.dev.rto(qp), LINGER_MAX / 2)
    start = _time.monotonic()
    seen = [None, start]

    def quiet_enough():
        n = nic.dev.counters["rcvd_pkts"]
        t = _time.monotonic()
        if n != seen[0]:
            seen[0], seen[1] = n, t
        return t - seen[1] >= quiet

    nic.wait_until(quiet_enough, timeout=LINGER_MAX, recheck=quiet / 4)


extern = Externs()


def install(ffi, lib=None) -> None:
    """Register this module's sn_* functions with the embedded module's ffi."""
    global _wc, _post_records, _post_recvs
    _wc = _wc_struct(ffi)
    _post_records, _post_recvs = _records_post(ffi)
    extern.install(ffi)
    if lib is not None:
        def after_fork_in_child() -> None:
            # a Python host forked (its interpreter is whole in the child): the child
            # opens devices of its own (embed.c); the objects of the parent's devices
            # are the parent's, and fail here with EIO
            if _nic.open_nics() or _objs:
                _inherited.update(_objs)
                _objs.clear()
                _nic.forget_after_fork()
            lib.sn_fork_resumed()
        os.register_at_fork(after_in_child=after_fork_in_child)


def _records_post(ffi):
    """``post_records`` and ``post_recvs`` of softnic/accel/post.c, set up for
    ``ffi``'s struct sn_send_wr and sn_recv_wr: a chain's records posted as
    ``_send_wr`` and ``Verbs.post_send`` (``_recv_wr`` and ``post_recv`` or
    ``post_srq_recv``) post them, without a ``SendWR`` (``RecvWR``), up to the first
    it leaves to them; (None, None) where the extension cannot be had
    (``SOFTNIC_KERNEL=0``, no compiler) or the records are laid out otherwise
    than post.c's."""
    from softnic import accel
    m = accel.fabric_loop()
    t = ffi.typeof("struct sn_send_wr")
    r = ffi.typeof("struct sn_recv_wr")
    if m is None or tuple(name for name, _ in t.fields) != _SEND_WR_FIELDS \
            or tuple(name for name, _ in r.fields) != _RECV_WR_FIELDS:
        return None, None
    ops = {int(op): (op, op in MAY_INLINE, op in RD_ATOMIC, op in ATOMICS) for op in _FAST_POST}
    try:
        m.post_setup(SendWQE, QPState.RTS, QPType.RC, ops, int(SendFlags.INLINE),
                     int(SendFlags.SIGNALED), ffi.sizeof(t),
                     tuple(f.offset for _, f in t.fields), ffi.sizeof("struct sn_sge"))
        m.recv_setup(RecvWQE, _RECEIVING, ffi.sizeof(r), tuple(f.offset for _, f in r.fields))
    except RuntimeError:
        return None, None
    return m.post_records, m.post_recvs


def _wc_struct(ffi) -> struct.Struct:
    """api.h's struct sn_wc as the C side was built, for one ``pack_into`` per
    completion (a cffi field set per field cost about 0.9 us a completion): each
    field's integer code by its size and sign, at its offset, the struct's size
    apart.  Its fields must come in ``_WC_FIELDS``' order (else RuntimeError: the
    face does not start)."""
    t = ffi.typeof("struct sn_wc")
    names = tuple(name for name, _ in t.fields)
    if names != _WC_FIELDS:
        raise RuntimeError(f"api.h's struct sn_wc has the fields {names}; "
                           f"backend._write_wcs writes {_WC_FIELDS}")
    fmt, at = "=", 0
    for _, f in t.fields:
        size = ffi.sizeof(f.type)
        code = _INT_CODES[size]
        fmt += "x" * (f.offset - at) + (code if int(ffi.cast(f.type, -1)) < 0 else code.upper())
        at = f.offset + size
    fmt += "x" * (ffi.sizeof(t) - at)
    return struct.Struct(fmt)


# ------------------------------------------------------------ devices and contexts

@extern(error=0)
def sn_device_count():
    return len(_nic.device_names())


@extern()
def sn_device_name(idx, name, length, guid):
    n = _nic.device_names()[idx].encode()[:length - 1]
    extern.ffi.memmove(name, n + b"\0", len(n) + 1)
    guid[0] = int.from_bytes(_nic.node_guid(_nic.device_names()[idx]).to_bytes(8, "big"),
                             sys.byteorder)


@extern()
def sn_open(idx, out):
    names = _nic.device_names()
    if not 0 <= idx < len(names):
        return errno.ENODEV
    nic = _nic.open_device(names[idx])
    out[0] = _new(_Obj(nic, eng=names[idx]))


@extern()
def sn_close(h):
    o = _objs.pop(h, None)
    if o is None:
        return errno.EINVAL
    o.nic.release()


@extern()
def sn_query_device(h, a):
    o = _get(h)
    cfg = o.nic.dev.config
    fw = getattr(softnic, "__version__", "0.1.0").encode()[:63]
    extern.ffi.memmove(a.fw_ver, fw + b"\0", len(fw) + 1)
    guid = int.from_bytes(_nic.node_guid(o.eng).to_bytes(8, "big"), sys.byteorder)
    a.node_guid = a.sys_image_guid = guid
    a.max_mr_size = cfg.max_mr_size
    a.page_size_cap = 0xFFFFF000
    a.vendor_id = 0xFFFFFF
    a.vendor_part_id = 0
    a.hw_ver = 0
    a.max_qp = cfg.max_qp
    a.max_qp_wr = cfg.max_qp_wr
    a.device_cap_flags = int(DEVICE_CAP_FLAGS)          # what the pyverbs API reports
    a.max_sge = a.max_sge_rd = cfg.max_sge
    a.max_cq = cfg.max_qp
    a.max_cqe = cfg.max_cqe
    a.max_mr = 1 << 20
    a.max_pd = 1 << 16
    a.max_qp_rd_atom = a.max_qp_init_rd_atom = cfg.max_rd_atomic
    a.max_res_rd_atom = cfg.max_qp * cfg.max_rd_atomic
    a.atomic_cap = 1                                    # IBV_ATOMIC_HCA
    a.max_ah = 1 << 20
    a.max_srq = cfg.max_qp
    a.max_srq_wr = cfg.max_qp_wr
    a.max_srq_sge = cfg.max_sge
    a.max_pkeys = 1
    a.local_ca_ack_delay = 15
    a.phys_port_cnt = 1
    a.max_inline_data = cfg.max_inline_data
    a.max_mcast_grp = _mcast.MAX_MCAST_GRP
    a.max_mcast_qp_attach = _mcast.MAX_MCAST_QP_ATTACH
    a.max_total_mcast_qp_attach = _mcast.MAX_TOTAL_MCAST_QP_ATTACH


@extern()
def sn_query_port(h, port, a):
    o = _get(h)
    if port != 1:
        return errno.EINVAL
    cfg = o.nic.dev.config
    with o.nic.lock:
        c = o.nic.dev.counters
        a.bad_pkey_cntr = c.get("rcvd_bad_pkey", 0) & 0xFFFF
        a.qkey_viol_cntr = c.get("rcvd_bad_qkey", 0) & 0xFFFF
    a.active_mtu = _MTU_ENUM.get(cfg.active_mtu, 5)
    a.max_msg_sz = min(cfg.max_msg_size, 0xFFFFFFFF)
    a.gid_tbl_len = GID_TABLE_LEN
    a.active_speed, a.active_width = port_speed(cfg.line_rate_bps)


@extern()
def sn_query_gid(h, port, index, raw):
    o = _get(h)
    if port != 1 or not 0 <= index < GID_TABLE_LEN:
        return errno.EINVAL
    if index >= GID_POPULATED:
        return errno.ENODATA             # an empty entry of the table (verbs_api.addr)
    extern.ffi.memmove(raw, _gid_bytes(o.nic.gid), 16)


@extern()
def sn_get_async_event(ctx, type_, cookie):
    c = _get(ctx)
    dev = c.nic.dev
    got = []

    def take():
        if dev.events:
            got.append(dev.events.popleft())
            return True
        return False

    if not c.nic.wait_until(take) or not got:
        return errno.EIO
    kind, obj = got[0]
    type_[0] = int(kind)
    for o in list(_objs.values()):
        if o.eng is obj:
            cookie[0] = o.cookie if o.cookie is not None else extern.ffi.NULL
            break

# ------------------------------------------------------------ protection domains

@extern()
def sn_alloc_pd(ctx, out):
    c = _get(ctx)
    out[0] = _new(_Obj(c.nic, c.nic.call(c.nic.dev.alloc_pd), ctx=c))


@extern()
def sn_dealloc_pd(h):
    o = _get(h)
    if o.cookie != "parent domain":        # a parent domain's PD is its creator's
        o.nic.call(o.nic.dev.dealloc_pd, o.eng)
    del _objs[h]


@extern()
def sn_alias_pd(pd, out):
    """A parent domain: a handle of its protection domain's engine PD."""
    p = _get(pd)
    out[0] = _new(_Obj(p.nic, p.eng, cookie="parent domain"))

# ------------------------------------------------------------ memory regions and device memory

@extern()
def sn_reg_mr(pd, addr, length, access, out, lkey, rkey):
    p = _get(pd)
    if addr == 0 and length == IMPLICIT_LENGTH and access & Access.ON_DEMAND:
        mr = p.nic.call(p.nic.dev.keys.register_implicit, p.eng, access)   # implicit ODP
    else:
        mr = p.nic.call(p.nic.dev.reg_mr, p.eng, addr, length, access)
    out[0] = _new(_Obj(p.nic, mr, ctx=p.ctx))
    lkey[0] = mr.lkey
    rkey[0] = mr.rkey


def _imported(ctx, h, kind):
    """The object behind handle ``h`` that ``ctx`` imports, and the handle of the context
    that created it (the C side checks that the two share a command file): a handle of no
    object on ctx's device is ENOENT, one of another kind (or of a parent domain, which
    has no handle of its own) EINVAL, as the kernel's lookup answers."""
    c = _get(ctx)
    o = _objs.get(h)
    if o is None or o.nic is not c.nic or o.ctx is None:
        raise VerbsError(errno.ENOENT, f"no object with handle {h} on this device")
    if not isinstance(o.eng, kind) or o.cookie == "parent domain":
        raise VerbsError(errno.EINVAL, f"handle {h} is not a {kind.__name__}")
    owner = next((k for k, v in _objs.items() if v is o.ctx), None)
    if owner is None:
        raise VerbsError(errno.ENOENT, f"the context of handle {h} is closed")
    return o, owner


@extern()
def sn_import_pd(ctx, h, owner):
    _, owner[0] = _imported(ctx, h, _EnginePD)


@extern()
def sn_import_mr(ctx, h, owner, length, lkey, rkey, access):
    o, owner[0] = _imported(ctx, h, _EngineMR)
    mr = o.eng
    length[0] = mr.length
    lkey[0] = mr.lkey
    rkey[0] = mr.rkey
    access[0] = int(mr.access)


@extern()
def sn_rereg_mr(h, flags, pd, addr, length, access):
    o = _get(h)
    npd = _get(pd).eng if flags & 2 else None
    o.nic.call(o.nic.dev.keys.rereg, o.eng, flags, npd, addr, length,
               access & ~int(Access.ON_DEMAND))       # softnic never pins: always ODP


@extern()
def sn_dereg_mr(h):
    o = _get(h)
    o.nic.call(o.nic.dev.dereg_mr, o.eng)
    del _objs[h]


@extern()
def sn_dm_size(ctx, size):
    size[0] = _get(ctx).nic.dev.keys.dm.size


@extern()
def sn_reg_dm_mr(pd, addr, dm_length, offset, length, access, out, lkey, rkey):
    p = _get(pd)
    dm = external_device_memory(addr, dm_length)      # the library's device memory
    mr = p.nic.call(p.nic.dev.keys.reg_dm_mr, p.eng, dm, offset, length, access)
    out[0] = _new(_Obj(p.nic, mr))
    lkey[0] = mr.lkey
    rkey[0] = mr.rkey

# ------------------------------------------------------------ memory windows

@extern()
def sn_alloc_mw(pd, type_, out, rkey):
    p = _get(pd)
    mw = p.nic.call(p.nic.dev.keys.alloc_mw, p.eng, type_)
    out[0] = _new(_Obj(p.nic, mw))
    rkey[0] = mw.rkey


@extern()
def sn_dealloc_mw(h):
    o = _get(h)
    o.nic.call(o.nic.dev.keys.dealloc_mw, o.eng)
    del _objs[h]


@extern()
def sn_bind_mw(h, wr_id, send_flags, mw_rkey, rkey, mr_lkey, addr, length, access):
    from softnic.core.memory import MWBind
    o = _objs.get(h)
    if o is None:
        return errno.EINVAL
    wr = SendWR(wr_id=wr_id, opcode=8, sg_list=[], send_flags=send_flags,     # BIND_MW
                bind=MWBind(mw_rkey, rkey, mr_lkey, addr, length, access))
    o.nic.call(o.nic.dev.post_send, o.eng, wr)

# ------------------------------------------------------------ address handles

@extern()
def sn_create_ah(pd, a, out):
    p = _get(pd)
    out[0] = _new(_Obj(p.nic, _engine_ah(a)))


@extern()
def sn_destroy_ah(h):
    _get(h)
    del _objs[h]

# ------------------------------------------------------------ completion channels and CQs

@extern()
def sn_create_channel(ctx, fd, out):
    c = _get(ctx)
    o = _Obj(c.nic, ctx=c)
    o.cookie = fd            # the channel's eventfd: one count per event, for poll()
    out[0] = _new(o)


@extern()
def sn_destroy_channel(h):
    o = _get(h)
    if any(not cq.closed for cq in o.cqs):
        return errno.EBUSY
    o.closed = True
    del _objs[h]


@extern()
def sn_create_cq(ctx, cqe, ch, cookie, out, actual):
    c = _get(ctx)
    ecq = c.nic.call(c.nic.dev.create_cq, cqe)
    o = _Obj(c.nic, ecq, ctx=c, cookie=cookie)
    if ch:
        o.channel = _get(ch)
        o.channel.cqs.append(o)
        ecq.on_event = lambda _cq, fd=o.channel.cookie: os.write(fd, _ONE)
    out[0] = _new(o)
    actual[0] = cqe


@extern()
def sn_destroy_cq(h):
    o = _get(h)
    o.nic.call(o.nic.dev.destroy_cq, o.eng)
    o.closed = True
    o.eng.on_event = None
    if o.channel is not None:
        o.channel.cqs.remove(o)
    del _objs[h]


@extern()
def sn_resize_cq(h, cqe, actual):
    o = _get(h)
    with o.nic.lock:
        if not len(o.eng.entries) <= cqe <= o.nic.dev.config.max_cqe or cqe < 1:
            return errno.EINVAL
        o.eng.depth = cqe
    actual[0] = cqe


@extern()
def sn_cq_fastpoll(h, view):
    """Where shim.c's ibv_poll_cq reads whether a poll would find nothing and do
    nothing, without entering Python (``sn_cq_idle``): the CQ's mirror (the engine
    keeps it: completions queued, armed and not polled since) and the device's
    ``NIC.fast_view``, as
    addresses; EOPNOTSUPP where there is none (every poll enters Python)."""
    o = _get(h)
    fv = o.nic.fast_view() if hasattr(o.nic, "fast_view") else None
    if fv is None:
        return errno.EOPNOTSUPP
    ffi = extern.ffi
    with o.nic.lock:
        o.mirror = ffi.new("int32_t[2]")
        o.eng.mirror = o.mirror
        o.eng.mirrored()
    view[0] = _address(o.mirror)
    view[1], view[2], view[3] = (_address(c) for c in fv)


def _address(c) -> int:
    """The address of a cffi array (the engine's and the compiled sleep's are made
    by other ffi instances of the same backend)."""
    return int(extern.ffi.cast("uintptr_t", c))


def _more_to_complete(dev, got) -> bool:
    """May a QP of these completions complete more work without a new post: sends
    outstanding, or receives posted (on its receive queue or its SRQ)?"""
    outstanding = dev.work_outstanding
    for w in got:
        if outstanding(w.qp_num):
            return True
    return False


def _write_wcs(ffi, wc: struct.Struct, out, got, l3: int) -> None:
    """The completions ``got`` into the program's array ``out`` of api.h's struct
    sn_wc, one ``wc.pack_into`` each (``_wc_struct``)."""
    size = wc.size
    buf = ffi.buffer(out, len(got) * size)
    pack = wc.pack_into
    at = 0
    for w in got:
        flags = int(w.wc_flags)         # (an int: IntFlag's & costs a microsecond)
        # imm_data: the invalidated rkey with IBV_WC_WITH_INV.  sl: a receive with a GRH
        # (UD) says in sl what L3 header the GRH area holds, as mlx5 does on RoCE (2:
        # IPv4, in its last 20 bytes; 1: IPv6); UCX's ud_verbs reads the destination
        # address from there by it
        pack(buf, at, w.wr_id, w.status, w.opcode, w.vendor_err, w.byte_len,
             (w.invalidated_rkey if flags & _WC_WITH_INV else w.imm_data) & 0xFFFFFFFF,
             w.qp_num, w.src_qp, flags, w.pkey_index, w.slid,
             l3 if flags & _WC_GRH else w.sl, w.dlid_path_bits)
        at += size


@extern(error=-1)
def sn_poll_cq(h, n, out, seen):
    o = _objs.get(h)
    if o is None:
        return -errno.EINVAL
    nic = o.nic
    # The first poll since the program armed the CQ: it sleeps on its channel next
    # (CQ.arm_unpolled; this poll clears it).  Later polls of a CQ still armed spin.
    arm = o.eng.arm_unpolled
    nic.poll(1 if arm else POLL_RUNS, seen=bool(seen))
    with nic.lock:
        try:
            got = nic.dev.poll_cq(o.eng, n)
        except CQOverflow:
            return -errno.EOVERFLOW
    if not got:
        # a program spinning on this CQ: move this process's other devices along (the
        # peer may be one of them).  No yield to the progress threads here: this
        # caller's inline steps do their work while its lease is fresh, and a thread
        # that still wants the interpreter gets it within the switch interval; a
        # sleep(0) per empty poll handed it over on every turn and doubled the
        # latency of a program spinning for its completion
        if _nic.open_count() > 1:
            for other in _nic.open_nics():
                if other is not nic:
                    other.poll()
    answering = bool(got) and not _more_to_complete(nic.dev, got)
    if answering or arm and o.eng.armed and (o.channel is None or not o.channel.sleeper):
        # The caller gives its lease back, and the progress thread takes what
        # arrives from now on, when it is about to wait elsewhere: on its channel
        # (it armed the CQ and this is its first poll since, the one that looks for
        # what came meanwhile: ibv_get_cq_event comes next; a program that keeps
        # polling a CQ it armed once spins, and keeps its lease), or on memory
        # (nothing more can complete on these QPs without a new post: perftest's
        # WRITE latency test spins on a byte next).  A caller whose QPs still have sends in
        # flight or receives posted polls again (a bandwidth test, UCX's progress
        # loop): it keeps its lease, and its inline steps take what arrives.  So
        # does a caller whose armed CQ's channel ibv_get_cq_event sleeps on for it,
        # taking the lease again (a channel the program polls itself, non-blocking
        # (UCX's, libfabric's), needs the progress thread).
        nic.end_lease(answering)
    if got:
        _write_wcs(extern.ffi, _wc, out, got, _SL_IPV6 if ":" in nic.ip else _SL_IPV4)
    return len(got)


@extern()
def sn_req_notify_cq(h, solicited_only):
    o = _get(h)
    nic = o.nic
    with nic.lock:
        o.eng.req_notify(bool(solicited_only))
    ch = o.channel
    if ch is not None and not ch.sleeper:
        # A program that waits on its channel's fd itself (poll(2) or epoll on it:
        # UCX's ucp_worker_wait, libfabric's fi_wait; never ibv_get_cq_event's sleep,
        # which steps the device itself) arms and sleeps, maybe without a poll
        # between: nothing calls softnic until the event, so the progress thread
        # takes what arrives from now on, not once the lease lapses.  A program
        # that polls after the arm takes the lease again with that poll.
        nic.end_lease_to_sleep()


def _event_waiting(cqs):
    """The first of a channel's CQs with an event not yet taken, or None."""
    for cq in cqs:
        if cq.eng.events > cq.taken:
            return cq
    return None


@extern()
def sn_cq_wait_begin(h, sock, spin_ns):
    """ibv_get_cq_event is about to sleep on the channel and the device's socket
    (shim.c's sn_cq_wait): the socket's fd, or -1 to sleep on the channel alone;
    and how long it first looks at both without sleeping (the progress thread's
    busy poll, ``PROGRESS_SPIN``)."""
    ch = _get(h)
    sock[0] = -1 if ch.closed else ch.nic.hold_for_waiter()
    spin_ns[0] = 0
    if sock[0] >= 0:
        ch.sleeper = True
        spin_ns[0] = _nic.PROGRESS_SPIN_NS


@extern()
def sn_cq_wait_step(h, spun):
    """sn_cq_wait woke on the socket (or its second passed): step the device here
    (inline: what the step produces waits for the program's next call if it made an
    event), then, without an event, sleep again holding the lease.  ``spun``: it
    found the datagram while it spun."""
    ch = _get(h)
    if ch.closed:
        return errno.EIO
    nic = ch.nic
    cqs = ch.cqs
    if spun:
        nic.spun_for_waiter()
    if nic.waiter_step(lambda: _event_waiting(cqs) is not None):
        return                           # an event: what the step holds waits for the program
    if nic.hold_for_waiter() < 0:
        return errno.EIO                 # (the device closed under the waiter)


@extern()
def sn_cq_wait_end(h):
    """sn_cq_wait returns to the program (an event, a signal, a cancellation)."""
    o = _objs.get(h)
    if o is not None and not o.closed:
        o.nic.waiter_done()


@extern()
def sn_get_cq_event(h, cookie):
    ch = _get(h)
    got = []

    def ready():
        if ch.closed:
            return True
        cq = _event_waiting(ch.cqs)
        if cq is not None:
            got.append(cq)
            return True
        return False

    with ch.nic.lock:                    # (the event is there: the channel said so)
        found = ready()
    if not found and not ch.nic.wait_until(ready) or not got:
        return errno.EIO
    got[0].taken += 1
    cookie[0] = got[0].cookie

# ------------------------------------------------------------ work requests' scatter/gather lists

def _sges(sg, n, limit):
    """The ``n`` SGEs of a work request's list ``sg``, for a queue that takes at most
    ``limit``.  A list longer than that is refused by the engine's count check; the
    program's array may be no longer than what the queue takes (mlx5 checks the
    count before it reads an entry), so it is not read: ``n`` empty entries stand
    in for it."""
    if n > limit:
        return [(0, 0, 0)] * n
    if n == 1:                  # (the common case, without a comprehension's frame)
        s = sg[0]
        return [(s.addr, s.length, s.lkey)]
    return [(sg[i].addr, sg[i].length, sg[i].lkey) for i in range(n)]

# ------------------------------------------------------------ shared receive queues

@extern()
def sn_create_srq(pd, max_wr, max_sge, limit, cookie, out):
    p = _get(pd)
    srq = p.nic.call(p.nic.dev.create_srq, p.eng, max_wr, max_sge, limit)
    out[0] = _new(_Obj(p.nic, srq, cookie=cookie))


@extern()
def sn_modify_srq(h, max_wr, limit, mask):
    o = _get(h)
    with o.nic.lock:
        o.eng.modify(max_wr=max_wr if mask & 1 else None,       # IBV_SRQ_MAX_WR
                     srq_limit=limit if mask & 2 else None)     # IBV_SRQ_LIMIT


@extern()
def sn_query_srq(h, max_wr, max_sge, limit):
    o = _get(h)
    max_wr[0] = o.eng.max_wr
    max_sge[0] = o.eng.max_sge
    limit[0] = o.eng.srq_limit


@extern()
def sn_destroy_srq(h):
    o = _get(h)
    o.nic.call(o.nic.dev.destroy_srq, o.eng)
    del _objs[h]


@extern()
def sn_post_srq_recv_list(h, ws, n, done):
    done[0] = 0
    o = _get(h)
    o.nic.post_recv(_post_recv_list, o.nic.dev, o, ws, n, done, True)


def _post_recv_list(dev, o, ws, n, done, srq: bool) -> None:
    """``ibv_post_recv``'s (``srq``: ``ibv_post_srq_recv``'s) chain ``ws`` of ``n``
    records to ``o``: those the compiled post takes (``_post_recvs``: the common
    case of ``_recv_wr`` and ``Verbs.post_recv``, or ``post_srq_recv`` and
    ``SRQ.post``, where they are those), then the rest through ``_post_chain``,
    from the first it left on (its error, or its case)."""
    k = 0
    fast = _post_recvs
    cls = type(dev)
    if fast is not None and (cls.post_srq_recv is _VERBS_POST_SRQ_RECV
                             and type(o.eng).post is _SRQ_POST if srq
                             else cls.post_recv is _VERBS_POST_RECV):
        k = fast(o.eng, _address(ws), n, srq)
        if k == n:
            done[0] = n
            return
    if srq:
        _post_chain(dev.post_srq_recv, o.eng, lambda w: _recv_wr(w, o.eng.max_sge), ws, n,
                    done, k)
    else:
        _post_chain(dev.post_recv, o.eng, lambda w: _recv_wr(w, o.eng.cap.max_recv_sge), ws,
                    n, done, k)

# ------------------------------------------------------------ queue pairs

@extern()
def sn_create_qp(pd, i, cookie, out, qpn):
    p = _get(pd)
    c = i.cap
    init = QPInitAttr(qp_type=QPType(i.qp_type), send_cq=_get(i.send_cq).eng,
                      recv_cq=_get(i.recv_cq).eng,
                      srq=_get(i.srq).eng if i.srq else None,
                      cap=QPCap(c.max_send_wr, c.max_recv_wr, c.max_send_sge,
                                c.max_recv_sge, c.max_inline_data),
                      sq_sig_all=bool(i.sq_sig_all))
    qp = p.nic.call(p.nic.dev.create_qp, p.eng, init)
    c.max_send_wr, c.max_recv_wr = qp.cap.max_send_wr, qp.cap.max_recv_wr
    c.max_send_sge, c.max_recv_sge = qp.cap.max_send_sge, qp.cap.max_recv_sge
    c.max_inline_data = qp.cap.max_inline_data
    out[0] = _new(_Obj(p.nic, qp, cookie=cookie))
    qpn[0] = qp.qpn


@extern()
def sn_modify_qp(h, a, mask):
    o = _get(h)
    ah = _engine_ah(a.ah) if mask & (1 << 7) else AHAttr()
    attr = QPAttr(qp_state=QPState(a.qp_state) if mask & 1 else QPState.RESET,
                  cur_qp_state=QPState(a.cur_qp_state) if mask & 2 else QPState.RESET,
                  path_mtu=a.path_mtu if mask & (1 << 8) else 3,
                  qp_access_flags=Access(a.qp_access_flags), pkey_index=a.pkey_index,
                  port_num=a.port_num, qkey=a.qkey, ah_attr=ah, dest_qp_num=a.dest_qp_num,
                  rq_psn=a.rq_psn, sq_psn=a.sq_psn, max_rd_atomic=a.max_rd_atomic,
                  max_dest_rd_atomic=a.max_dest_rd_atomic, min_rnr_timer=a.min_rnr_timer,
                  timeout=a.timeout, retry_cnt=a.retry_cnt, rnr_retry=a.rnr_retry,
                  en_sqd_async_notify=a.en_sqd_async_notify,
                  path_mig_state=a.path_mig_state)
    o.nic.call(o.nic.dev.modify_qp, o.eng, attr, mask)


@extern()
def sn_query_qp(h, a, i):
    o = _get(h)
    attr, init = o.nic.call(o.nic.dev.query_qp, o.eng)
    a.qp_state = attr.qp_state
    a.cur_qp_state = attr.cur_qp_state
    a.path_mtu = attr.path_mtu
    a.path_mig_state = attr.path_mig_state
    a.qkey = attr.qkey
    a.rq_psn = attr.rq_psn
    a.sq_psn = attr.sq_psn
    a.dest_qp_num = attr.dest_qp_num
    a.qp_access_flags = int(attr.qp_access_flags)
    cap = attr.cap
    a.cap.max_send_wr, a.cap.max_recv_wr = cap.max_send_wr, cap.max_recv_wr
    a.cap.max_send_sge, a.cap.max_recv_sge = cap.max_send_sge, cap.max_recv_sge
    a.cap.max_inline_data = cap.max_inline_data
    ah = attr.ah_attr
    if ah.dgid not in ("", "::"):
        extern.ffi.memmove(a.ah.dgid, _gid_bytes(ah.dgid), 16)
        a.ah.is_global = 1
    a.ah.flow_label = ah.flow_label
    a.ah.sgid_index = ah.sgid_index
    a.ah.hop_limit = ah.hop_limit
    a.ah.traffic_class = ah.traffic_class
    a.ah.sl = ah.sl
    a.ah.port_num = ah.port_num
    a.pkey_index = attr.pkey_index
    a.en_sqd_async_notify = attr.en_sqd_async_notify
    a.sq_draining = 0
    a.max_rd_atomic = attr.max_rd_atomic
    a.max_dest_rd_atomic = attr.max_dest_rd_atomic
    a.min_rnr_timer = attr.min_rnr_timer
    a.port_num = attr.port_num
    a.timeout = attr.timeout
    a.retry_cnt = attr.retry_cnt
    a.rnr_retry = attr.rnr_retry
    i.qp_type = int(init.qp_type)
    i.sq_sig_all = int(init.sq_sig_all)


@extern()
def sn_mcast(h, gid, attach):
    """ibv_attach_mcast / ibv_detach_mcast."""
    o = _get(h)
    raw = bytes(extern.ffi.buffer(gid, 16))
    if attach:
        _mcast.attach(o.nic, o.eng.qpn, o.eng.qp_type == QPType.UD, raw)
    else:
        _mcast.detach(o.nic, o.eng.qpn, raw)


@extern()
def sn_destroy_qp(h):
    o = _get(h)
    _linger(o.nic, o.eng)
    o.nic.call(o.nic.dev.destroy_qp, o.eng)
    if getattr(o.nic, '_mcast', None):
        _mcast.detach_qp(o.nic, o.eng.qpn)
    del _objs[h]


def _post_chain(post, eng, record, ws, n, done, start: int = 0) -> None:
    """Post a chain's ``n`` flat records ``ws`` in order with ``post(eng, wr)``, each
    made a work request by ``record``, from ``ws[start]`` on (those before it
    posted already); ``done[0]`` counts those posted, so the first one refused
    (its error raised) is ``ws[done[0]]``.  One call of the C face per chain: the
    device's lock taken and its output sent once for all of them."""
    for i in range(start, n):
        done[0] = i
        post(eng, record(ws[i]))
    done[0] = n


def _recv_wr(w, limit: int) -> RecvWR:
    return RecvWR(w.wr_id, _sges(w.sg_list, w.num_sge, limit))


def _send_wr(o: _Obj, w) -> SendWR:
    """The engine's work request for the flat record ``w`` posted on QP ``o``."""
    ah = None
    if w.ah:
        ah = _get(w.ah).eng
    # (positional, in SendWR's field order: a dataclass takes them faster than keywords)
    wr = SendWR(w.wr_id, w.opcode, _sges(w.sg_list, w.num_sge, o.eng.cap.max_send_sge),
                w.send_flags, w.imm_data, w.invalidate_rkey, w.remote_addr, w.rkey,
                w.compare_add, w.swap, ah, w.remote_qpn, w.remote_qkey)
    if getattr(o.eng, "xrc", None) == "ini":      # an XRC initiator: the remote XRC SRQ travels in remote_qpn
        wr.xrc_srqn = w.remote_qpn
    if w.opcode == WROpcode.ATOMIC_WRITE:      # its 8 bytes, as stored in swap
        wr.atomic_data = int(w.swap).to_bytes(8, sys.byteorder)
    elif w.opcode == WROpcode.FLUSH:           # len in compare_add, type | level << 8 in swap
        wr.length, wr.flush_type, wr.flush_level = w.compare_add, w.swap & 0xFF, \
            (w.swap >> 8) & 0xFF
        wr.compare_add = wr.swap = 0
    return wr


@extern()
def sn_post_send(h, w):
    """One work request of the ibv_wr_* API (``ibv_wr_complete``)."""
    o = _objs.get(h)
    if o is None:
        return errno.EINVAL
    o.nic.call(o.nic.dev.post_send, o.eng, _send_wr(o, w))


@extern()
def sn_post_send_list(h, ws, n, done):
    """``ibv_post_send``'s chain (``_post_list``)."""
    done[0] = 0
    o = _objs.get(h)
    if o is None:
        return errno.EINVAL
    nic = o.nic
    nic.post(o.eng.qpn, _post_list, nic.dev, o, ws, n, done)


def _post_list(dev, o, ws, n, done) -> None:
    """``ibv_post_send``'s chain ``ws`` of ``n`` records on QP ``o``: those the
    compiled post takes (``_post_records``: the common case of ``_send_wr`` and
    ``Verbs.post_send``, for a device whose ``post_send`` is that one), then the rest
    through ``_post_chain``, from the first it left on (its error, or its case)."""
    k = 0
    fast = _post_records
    if fast is not None and type(dev).post_send is _VERBS_POST_SEND:
        k = fast(dev, o.eng, _address(ws), n)
        if k == n:
            done[0] = n
            return
    _post_chain(dev.post_send, o.eng, partial(_send_wr, o), ws, n, done, k)


@extern()
def sn_post_recv_list(h, ws, n, done):
    """``ibv_post_recv``'s chain (``_post_recv_list``)."""
    done[0] = 0
    o = _objs.get(h)
    if o is None:
        return errno.EINVAL
    o.nic.post_recv(_post_recv_list, o.nic.dev, o, ws, n, done, False)

# ------------------------------------------------------------ XRC domains, XRC SRQs and XRC QPs

@extern()
def sn_open_xrcd(ctx, fd, oflags, out):
    c = _get(ctx)
    key = None
    if fd >= 0:              # one domain per file on a device (shared by its openers)
        st = os.fstat(fd)
        key = (c.eng, st.st_dev, st.st_ino)
        shared = _xrcd_files.get(key)
        if shared is not None:
            if oflags & os.O_EXCL:
                return errno.EEXIST
            shared[1] += 1
            out[0] = _new(_Obj(c.nic, shared[0], cookie=key))
            return
        if not oflags & os.O_CREAT:
            return errno.ENOENT
    x = c.nic.call(xrc.open_xrcd, c.nic.dev)
    if key is not None:
        _xrcd_files[key] = [x, 1]
    out[0] = _new(_Obj(c.nic, x, cookie=key))


@extern()
def sn_close_xrcd(h):
    o = _get(h)
    key = o.cookie
    if key is not None and key in _xrcd_files:
        _xrcd_files[key][1] -= 1
        if _xrcd_files[key][1] > 0:
            del _objs[h]
            return
    o.nic.call(xrc.close_xrcd, o.nic.dev, o.eng)
    if key is not None:
        _xrcd_files.pop(key, None)
    del _objs[h]


@extern()
def sn_make_xrc_srq(srq, xrcd, cq):
    s = _get(srq)
    s.nic.call(xrc.make_srq, s.eng, _get(xrcd).eng, _get(cq).eng)


@extern()
def sn_srq_num(srq, num):
    num[0] = _get(srq).eng.handle         # the number an XRCETH names


@extern()
def sn_create_xrc_qp(pd, xrcd, role, send_cq, cap, sq_sig_all, cookie, out, qpn):
    if role == 0:                         # an initiator, in a PD
        p = _get(pd)
        nic, epd, x, name = p.nic, p.eng, None, "ini"
    else:                                 # a target, in its XRC domain
        d = _get(xrcd)
        nic, epd, x, name = d.nic, d.eng.pd, d.eng, "tgt"
    init = QPInitAttr(qp_type=QPType.RC,
                      send_cq=_get(send_cq).eng if send_cq and role == 0 else None,
                      cap=QPCap(cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge,
                                cap.max_recv_sge, cap.max_inline_data),
                      sq_sig_all=bool(sq_sig_all), xrc=name, xrcd=x)
    qp = nic.call(nic.dev.create_qp, epd, init)
    cap.max_send_wr, cap.max_recv_wr = qp.cap.max_send_wr, qp.cap.max_recv_wr
    cap.max_send_sge, cap.max_recv_sge = qp.cap.max_send_sge, qp.cap.max_recv_sge
    cap.max_inline_data = qp.cap.max_inline_data
    out[0] = _new(_Obj(nic, qp, cookie=cookie))
    qpn[0] = qp.qpn
