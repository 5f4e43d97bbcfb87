"""Flow steering specs (``pyverbs.spec``): what a flow matches, header field by header
field, each value with its mask, as pyverbs builds them for ``ibv_create_flow``.

They are data: a spec is built without a device.  softnic steers no raw Ethernet
traffic, so a ``Flow`` made of them is refused (``pyverbs.flow``)."""

from __future__ import annotations

from . import enums as e
from .base import PyverbsObject
from .pyverbs_error import PyverbsUserError

_FULL = {'mac': 'ff:ff:ff:ff:ff:ff', 'ipv4': '255.255.255.255',
         'ipv6': 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff'}


class Spec(PyverbsObject):
    """One header's match: ``spec_type`` (IBV_FLOW_SPEC_*, with IBV_FLOW_SPEC_INNER for
    an inner header), and per field a value and a mask; a field given without a mask
    is matched whole (all ones), as pyverbs does."""

    _fields: tuple[tuple[str, str | int], ...] = ()   # (field, the mask of a whole match)

    def __init__(self, spec_type=0, is_inner=False, **values):
        super().__init__()
        self.spec_type = spec_type | (e.IBV_FLOW_SPEC_INNER if is_inner else 0)
        for field, full in self._fields:
            value, mask = values.get(field), values.get(field + '_mask')
            setattr(self, field, value if value is not None else 0)
            setattr(self, field + '_mask',
                    mask if mask is not None else (full if value is not None else 0))

    def __str__(self):
        return f'{type(self).__name__}:\n' + ''.join(
            f'  {f:<22}: {getattr(self, f)!s:<24} mask {getattr(self, f + "_mask")!s}\n'
            for f, _ in self._fields)


class EthSpec(Spec):
    _fields = (('dst_mac', _FULL['mac']), ('src_mac', _FULL['mac']),
               ('ether_type', 0xFFFF), ('vlan_tag', 0xFFFF))

    def __init__(self, dst_mac=None, dst_mac_mask=None, src_mac=None, src_mac_mask=None,
                 ether_type=None, ether_type_mask=None, vlan_tag=None, vlan_tag_mask=None,
                 is_inner=0):
        super().__init__(e.IBV_FLOW_SPEC_ETH, is_inner, dst_mac=dst_mac,
                         dst_mac_mask=dst_mac_mask, src_mac=src_mac, src_mac_mask=src_mac_mask,
                         ether_type=ether_type, ether_type_mask=ether_type_mask,
                         vlan_tag=vlan_tag, vlan_tag_mask=vlan_tag_mask)


class Ipv4ExtSpec(Spec):
    _fields = (('dst_ip', _FULL['ipv4']), ('src_ip', _FULL['ipv4']), ('proto', 0xFF),
               ('tos', 0xFF), ('ttl', 0xFF), ('flags', 0xFF))

    def __init__(self, dst_ip=None, dst_ip_mask=None, src_ip=None, src_ip_mask=None,
                 proto=None, proto_mask=None, tos=None, tos_mask=None, ttl=None,
                 ttl_mask=None, flags=None, flags_mask=None, is_inner=False):
        super().__init__(e.IBV_FLOW_SPEC_IPV4_EXT, is_inner, dst_ip=dst_ip,
                         dst_ip_mask=dst_ip_mask, src_ip=src_ip, src_ip_mask=src_ip_mask,
                         proto=proto, proto_mask=proto_mask, tos=tos, tos_mask=tos_mask,
                         ttl=ttl, ttl_mask=ttl_mask, flags=flags, flags_mask=flags_mask)


class Ipv6Spec(Spec):
    _fields = (('dst_ip', _FULL['ipv6']), ('src_ip', _FULL['ipv6']),
               ('flow_label', 0xFFFFF), ('next_hdr', 0xFF), ('traffic_class', 0xFF),
               ('hop_limit', 0xFF))

    def __init__(self, dst_ip=None, dst_ip_mask=None, src_ip=None, src_ip_mask=None,
                 flow_label=None, flow_label_mask=None, next_hdr=None, next_hdr_mask=None,
                 traffic_class=None, traffic_class_mask=None, hop_limit=None,
                 hop_limit_mask=None, is_inner=False):
        super().__init__(e.IBV_FLOW_SPEC_IPV6, is_inner, dst_ip=dst_ip,
                         dst_ip_mask=dst_ip_mask, src_ip=src_ip, src_ip_mask=src_ip_mask,
                         flow_label=flow_label, flow_label_mask=flow_label_mask,
                         next_hdr=next_hdr, next_hdr_mask=next_hdr_mask,
                         traffic_class=traffic_class, traffic_class_mask=traffic_class_mask,
                         hop_limit=hop_limit, hop_limit_mask=hop_limit_mask)


class TcpUdpSpec(Spec):
    _fields = (('dst_port', 0xFFFF), ('src_port', 0xFFFF))

    def __init__(self, spec_type, dst_port=None, dst_port_mask=None, src_port=None,
                 src_port_mask=None, is_inner=False):
        if spec_type not in (e.IBV_FLOW_SPEC_TCP, e.IBV_FLOW_SPEC_UDP):
            raise PyverbsUserError('Spec type must be TCP or UDP')
        super().__init__(spec_type, is_inner, dst_port=dst_port, dst_port_mask=dst_port_mask,
                         src_port=src_port, src_port_mask=src_port_mask)


__all__ = ['Spec', 'EthSpec', 'Ipv4ExtSpec', 'Ipv6Spec', 'TcpUdpSpec']
