"""eXtended Reliable Connected transport (XRC): domains, XRC SRQs, initiator and target QPs.

An XRC initiator (INI, ``IBV_QPT_XRC_SEND``) is an RC requester whose every request names,
in an XRCETH after the BTH, the XRC SRQ that is to receive it; an XRC target (TGT,
``IBV_QPT_XRC_RECV``) is an RC responder with no receive queue of its own: each message is
received from the SRQ its XRCETH names, which must belong to the target's XRC domain, and
the memory it reaches is checked against that SRQ's PD (IBA 14.2.5 / 10.2.9.7); receive
completions go to the SRQ's CQ.  Both are RC inside the engine (the requester, responder
and completer rules are RC's); this module turns their packets into XRC ones on the way
out (the XRC opcode, 0xA0 + RC's suffix, and the XRCETH of a request) and picks the SRQ
on the way in.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..wire.roce import BTH_LEN, QPN_MASK, XRC_OPCODE_PREFIX, XRCETH_LEN, NakCode
from .errors import einval

_XRCETH = struct.Struct("!I")


@dataclass(eq=False)
class XRCD:
    """An XRC domain.  ``pd`` is the domain's own protection domain: the one a target QP,
    which belongs to no user PD, is created in."""
    handle: int
    pd: object
    tgts: set = field(default_factory=set)
    srqs: set = field(default_factory=set)
    closed: bool = False


def open_xrcd(dev) -> XRCD:
    pd = dev.alloc_pd()
    return XRCD(pd.handle, pd)


def close_xrcd(dev, xrcd: XRCD) -> None:
    if xrcd.closed:
        return
    if xrcd.tgts or xrcd.srqs:
        raise einval("XRC domain still has target QPs or XRC SRQs")
    xrcd.closed = True
    dev.dealloc_pd(xrcd.pd)


def make_srq(srq, xrcd: XRCD, cq) -> None:
    """Make ``srq`` an XRC SRQ of ``xrcd`` whose receive completions go to ``cq``."""
    if xrcd.closed or cq is None:
        raise einval("an XRC SRQ needs an open XRC domain and a CQ")
    srq.xrcd = xrcd
    srq.cq = cq
    xrcd.srqs.add(srq)


def forget_srq(srq) -> None:
    xrcd = getattr(srq, "xrcd", None)
    if xrcd is not None:
        xrcd.srqs.discard(srq)


def make_qp(qp, role: str, xrcd: XRCD | None) -> None:
    """Make ``qp`` (created as RC) an XRC initiator (role "ini") or target ("tgt")."""
    if role == "tgt":
        if xrcd is None or xrcd.closed:
            raise einval("an XRC target QP needs an open XRC domain")
        xrcd.tgts.add(qp)
    elif role != "ini":
        raise einval(f"XRC role {role!r}")
    qp.xrc = role
    qp.xrcd = xrcd
    qp.wire = "XRC"


def forget_qp(qp) -> None:
    if getattr(qp, "xrcd", None) is not None:
        qp.xrcd.tgts.discard(qp)
        qp.xrcd.pd.qps.discard(qp)      # created there; qp.pd follows the SRQ in use


def request(pkt, srqn: int) -> bytearray:
    """An RC request packet (no ICRC) as the XRC one: XRC opcode, XRCETH after the BTH."""
    out = bytearray(len(pkt) + XRCETH_LEN)
    out[0] = pkt[0] | XRC_OPCODE_PREFIX
    out[1:BTH_LEN] = pkt[1:BTH_LEN]
    _XRCETH.pack_into(out, BTH_LEN, srqn & QPN_MASK)
    out[BTH_LEN + XRCETH_LEN:] = pkt[BTH_LEN:]
    return out


def tag_responses(out: list, start: int) -> None:
    """The responses appended to ``out`` from ``start`` on get the XRC opcode."""
    for i in range(start, len(out)):
        entry = out[i]
        pkt = bytearray(entry[0])
        pkt[0] |= 0xA0
        out[i] = (pkt, entry[1]) if type(entry) is tuple else entry._replace(pkt=pkt)


def target(dev, qp, pkt) -> NakCode | None:
    """Point target QP ``qp`` at the XRC SRQ ``pkt``'s XRCETH names (its receive queue,
    its PD for memory checks, its CQ); the NAK code if it may not be used."""
    if qp.xrc != "tgt":
        dev.counters["rcvd_xrc_not_target"] += 1
        return NakCode.INVALID_REQUEST
    srq = dev.srqs.get(pkt.xrceth)
    if srq is None or srq.closed or getattr(srq, "xrcd", None) is not qp.xrcd:
        dev.counters["rcvd_xrc_bad_srq"] += 1      # an XRC domain violation
        return NakCode.INVALID_REQUEST
    qp.srq, qp.pd, qp.recv_cq = srq, srq.pd, srq.cq
    return None
