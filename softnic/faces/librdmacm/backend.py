"""The Python side of softnic's librdmacm.so.1: the sn_cm_* calls of callbacks.h.

The C side keeps the structs programs read (rdma_cm_id, rdma_cm_event,
rdma_event_channel) and drives the QPs through libibverbs, as rdma-core's
librdmacm does; this side keeps the ids, their addresses and connections
(``softnic.driver.rdmacm``) on the same live devices the process's libibverbs uses.
Every call returns 0 or a positive errno; an unexpected exception is printed
and becomes EIO (``softnic.faces.externs``).  The calls are plain module
functions, grouped by what they act on: event channels, ids, addresses and
routes, connections.
"""

from __future__ import annotations

import errno
import ipaddress

from softnic.driver import rdmacm as R
from softnic.core.errors import VerbsError

from ..externs import Externs

_chans: dict[int, R.EventChannel] = {}
_ids: dict[int, R.CmId] = {}
_next = [1]


def _new_handle() -> int:
    h = _next[0]
    _next[0] += 1
    return h


#: handles of destroyed channels (never reused: handles only grow), where a thread
#: still in rdma_get_cm_event waits on, as on the kernel's rdma_cm fd
_destroyed_chans: set[int] = set()


def _chan(h: int) -> R.EventChannel:
    try:
        return _chans[h]
    except KeyError:
        raise VerbsError(errno.EINVAL, f"no event channel {h}") from None


def _id(h: int) -> R.CmId:
    try:
        return _ids[h]
    except KeyError:
        raise VerbsError(errno.EINVAL, f"no rdma_cm id {h}") from None


_AF_INET, _AF_INET6 = 2, 10


def _addr(a) -> str:
    """The address of an ``sn_cm_addr`` (IPv4 for an IPv4-mapped IPv6 one)."""
    if a.family == _AF_INET:
        return str(ipaddress.IPv4Address(bytes(a.ip[0:4])))
    if a.family == _AF_INET6:
        return R.ip_text(bytes(a.ip[0:16]))
    raise VerbsError(errno.EAFNOSUPPORT, f"address family {a.family}")


def _put_ip(ip: str, raw) -> int:
    """Write ``ip`` into an ``sn_cm_info``'s 16-byte address field; its family."""
    a = ipaddress.ip_address(ip)
    extern.ffi.memmove(raw, a.packed, len(a.packed))
    return _AF_INET if a.version == 4 else _AF_INET6


extern = Externs(missing_device="softnic librdmacm")


def install(ffi, lib=None) -> None:
    """Register this module's sn_cm_* functions with the embedded module's ffi."""
    extern.install(ffi)


# ------------------------------------------------------------ event channels and events

@extern()
def sn_cm_create_channel(fd, out):
    ch = R.EventChannel(fd)          # the C side's eventfd (semaphore mode)
    h = _new_handle()
    _chans[h] = ch
    out[0] = h


@extern()
def sn_cm_destroy_channel(h):
    ch = _chans.pop(h, None)
    if ch is None:
        return errno.EINVAL
    _destroyed_chans.add(h)
    ch.close()


@extern()
def sn_cm_get_event(ch, e):
    if ch in _destroyed_chans:
        return errno.EAGAIN             # a waiter on a destroyed channel waits on
    ev = _chan(ch).take()
    if ev is None:
        return errno.EAGAIN
    cid = ev.id
    if ev.new:
        _ids[cid.handle] = cid
    e.event = ev.kind
    e.status = ev.status
    e.id = cid.handle
    e.id_cookie = cid.cookie if cid.cookie is not None else extern.ffi.NULL
    e.is_new = int(ev.new)
    if ev.listen_id is not None:
        e.listen_id = ev.listen_id.handle
        e.listen_cookie = ev.listen_id.cookie if ev.listen_id.cookie is not None else extern.ffi.NULL
    pd = ev.private_data[:256]
    extern.ffi.memmove(e.private_data, pd, len(pd))
    e.private_data_len = len(pd)
    e.responder_resources = ev.responder_resources & 0xFF
    e.initiator_depth = ev.initiator_depth & 0xFF
    e.retry_count = ev.retry_count
    e.rnr_retry_count = ev.rnr_retry_count
    e.srq = ev.srq
    e.qp_num = ev.qp_num
    e.qkey = ev.qkey
    if ev.mgid:
        extern.ffi.memmove(e.mgid, ev.mgid, 16)


# ------------------------------------------------------------ multicast

@extern()
def sn_cm_join(h, group):
    """rdma_join_multicast: MULTICAST_JOIN follows on the id's channel."""
    _id(h).join_multicast(_group_ip(group))


@extern()
def sn_cm_leave(h, group, mgid):
    """rdma_leave_multicast: the group's GID in ``mgid`` (the C side detaches the QP)."""
    extern.ffi.memmove(mgid, _id(h).leave_multicast(_group_ip(group)), 16)


def _group_ip(a) -> str:
    ip = _addr(a)
    if ":" in ip:
        raise VerbsError(errno.EAFNOSUPPORT, "softnic's rdma_cm joins IPv4 groups only")
    return ip


# ------------------------------------------------------------ ids

@extern()
def sn_cm_create_id(ch, cookie, ps, qp_type, out):
    if ps not in R.PORT_SPACES:
        return errno.EPROTONOSUPPORT
    cid = R.CmId(_chan(ch), ps=ps, qp_type=qp_type, cookie=cookie)
    _ids[cid.handle] = cid
    out[0] = cid.handle


@extern()
def sn_cm_set_cookie(h, cookie):
    _id(h).cookie = cookie


@extern()
def sn_cm_migrate_id(h, ch):
    cid = _id(h)
    cid.channel = _chan(ch)


@extern()
def sn_cm_destroy_id(h):
    cid = _ids.pop(h, None)
    if cid is None:
        return errno.EINVAL
    cid.destroy()


@extern()
def sn_cm_id_info(h, info):
    cid = _id(h)
    if cid.nic is not None:
        n = cid.nic.name.encode()[:63]
        extern.ffi.memmove(info.dev_name, n + b"\0", len(n) + 1)
        info.has_dev = 1
        extern.ffi.memmove(info.sgid, R.gid_of(cid.nic.ip), 16)
    if cid.src is not None:
        info.has_src = 1
        info.src_family = _put_ip(cid.src[0], info.src_ip)
        info.src_port = cid.src[1]
    if cid.dst is not None:
        info.has_dst = 1
        info.dst_family = _put_ip(cid.dst[0], info.dst_ip)
        info.dst_port = cid.dst[1]
        extern.ffi.memmove(info.dgid, cid.dgid, 16)
    info.routed = int(cid.state not in ("idle", "bound", "addr_resolved", "listen"))


# ------------------------------------------------------------ addresses and routes

@extern()
def sn_cm_bind(h, a):
    _id(h).bind(_addr(a), a.port)


@extern()
def sn_cm_resolve_addr(h, src, dst):
    cid = _id(h)
    s = _addr(src) if src.family else None
    if s in ("0.0.0.0", "::") and not src.port:
        s = None
    cid.resolve_addr(s, _addr(dst), dst.port)


@extern()
def sn_cm_resolve_route(h):
    _id(h).resolve_route()


@extern()
def sn_cm_listen(h, backlog):
    _id(h).listen(backlog)


# ------------------------------------------------------------ connections

@extern()
def sn_cm_connect(h, p):
    cid = _id(h)
    cid.connect(qpn=p.qp_num, responder_resources=p.responder_resources,
                initiator_depth=p.initiator_depth, retry_count=p.retry_count,
                rnr_retry_count=p.rnr_retry_count, srq=p.srq,
                private_data=bytes(extern.ffi.buffer(p.private_data, p.private_data_len)))


@extern()
def sn_cm_accept(h, p):
    cid = _id(h)
    cid.accept(qpn=p.qp_num, responder_resources=p.responder_resources,
               initiator_depth=p.initiator_depth, rnr_retry_count=p.rnr_retry_count,
               srq=p.srq, private_data=bytes(extern.ffi.buffer(p.private_data,
                                                        p.private_data_len)),
               qkey=p.qkey)


@extern()
def sn_cm_reject(h, pd, n):
    _id(h).reject(bytes(extern.ffi.buffer(pd, n)) if n else b"")


@extern()
def sn_cm_establish(h):
    _id(h).establish()


@extern()
def sn_cm_disconnect(h):
    _id(h).disconnect()


@extern()
def sn_cm_set_ack_timeout(h, t):
    _id(h).set_ack_timeout(t)


@extern()
def sn_cm_init_qp_attr(h, a, mask):
    attrs, m = _id(h).init_qp_attr(a.qp_state)
    for k, v in attrs.items():
        if k == "dgid":
            extern.ffi.memmove(a.dgid, bytes(v), 16)
        else:
            setattr(a, k, v)
    mask[0] = m


# ------------------------------------------------------------ the process

@extern()
def sn_cm_exit():
    import softnic.driver.nic as _nic
    for nic in _nic.open_nics():
        cap = getattr(nic, "capture", None)
        if cap is not None:
            cap.flush()
