"""The UDP source port of a RoCEv2 QP: the entropy an ECMP fabric hashes on.

A RoCEv2 NIC sends every packet of a QP from one UDP source port, derived from
the GRH flow label of the QP's address vector, or, when the label is 0, from
the two QP numbers; switches spread flows over equal-cost paths by the 5-tuple,
so QPs with different labels can take different paths.  This is the kernel's
rule (``rdma_get_udp_sport`` in include/rdma/ib_verbs.h, used by rxe, hns,
irdma): a port in 0xC000..0xFFFF.  softnic's devices all send from one socket,
so the port is not on the real wire; the simulated fabric and the capture can
take it from here.
"""

from __future__ import annotations

UDP_SPORT_MIN = 0xC000
FLOW_LABEL_MASK = 0xFFFFF


def calc_flow_label(lqpn: int, rqpn: int) -> int:
    """``rdma_calc_flow_label``: a label from the two QP numbers."""
    fl = (lqpn * rqpn) & 0xFFFFFFFFFFFFFFFF
    fl ^= fl >> 20
    fl ^= fl >> 40
    return fl & FLOW_LABEL_MASK


def flow_label_to_udp_sport(fl: int) -> int:
    """``rdma_flow_label_to_udp_sport``: fold the 20-bit label into 14 bits."""
    low, high = fl & 0x03FFF, fl & 0xFC000
    low ^= high >> 14
    return low | UDP_SPORT_MIN


def udp_sport(flow_label: int, lqpn: int, rqpn: int) -> int:
    """``rdma_get_udp_sport``: the source port of the QP ``lqpn`` talking to ``rqpn``."""
    fl = flow_label & FLOW_LABEL_MASK
    if not fl:
        fl = calc_flow_label(lqpn, rqpn)
    return flow_label_to_udp_sport(fl)


def qp_udp_sport(qp) -> int:
    """The source port of an engine QP (``core.qp.QP``) from its current attributes."""
    return udp_sport(qp.attr.ah_attr.flow_label, qp.qpn, qp.attr.dest_qp_num)
