"""GIDs, global routes, address vectors and address handles (``pyverbs.addr``).

GIDs print and parse in pyverbs' 8-group form
('0000:0000:0000:0000:0000:ffff:7f00:0002' for ::ffff:127.0.0.2).  On a
softnic port every GID is RoCEv2: the IPv4-mapped address of an IPv4 device or
the address of an IPv6 one, so an address vector must be global (carry a GRH)
and name such a GID; the UDP port of the peer is found from its GID.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import sys

import softnic.driver.nic as _nic
from softnic.core.errors import VerbsError
from softnic.core.qp import AHAttr as _EngineAH

from .base import PyverbsCM, PyverbsObject, rdma_error
from .pyverbs_error import PyverbsUserError
from .utils import gid_str_to_array

# A RoCE port's GID table is longer than what its netdev's addresses fill (rxe: 1024
# entries).  rxe on an IPv4 netdev populates 4 (programs hard-code index 1 or 3); each of
# softnic's holds the device's RoCEv2 GID.  The rest are empty, answered as the kernel
# does: ibv_query_gid gives zeros, ibv_query_gid_ex ENODATA, an AH naming one EINVAL.
GID_TABLE_LEN = 1024
GID_POPULATED = 4


def gid_to_raw(val) -> bytes:
    """A GID string -> its 16 bytes.  pyverbs' 8-group form, or any IPv6 / IPv4 text."""
    if isinstance(val, GID):
        return val._raw
    if isinstance(val, (bytes, bytearray)) and len(val) == 16:
        return bytes(val)
    text = str(val)
    try:
        return bytes(int(b, 16) for b in gid_str_to_array(text))
    except (PyverbsUserError, ValueError):
        pass
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise PyverbsUserError(f'Invalid GID value ({text})') from None
    if isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address(f'::ffff:{ip}')
    return ip.packed


def raw_to_str(raw: bytes) -> str:
    return ':'.join(raw[i:i + 2].hex() for i in range(0, 16, 2))


def raw_to_ip(raw: bytes) -> str:
    """The GID as an IPv6 address string, the form the engine takes."""
    return str(ipaddress.IPv6Address(raw))


def _half(raw: bytes, i: int) -> int:
    # a __be64 half of the GID as pyverbs shows it: big-endian memory read as a host int
    return int.from_bytes(raw[8 * i:8 * i + 8], sys.byteorder)


class GID(PyverbsObject):
    """A 16-byte GID (ibv_gid)."""

    def __init__(self, val=None):
        super().__init__()
        self._raw = bytes(16) if val is None else gid_to_raw(val)

    @property
    def gid(self):
        return raw_to_str(self._raw)

    @gid.setter
    def gid(self, val):
        self._set_gid(val)

    def _set_gid(self, val):
        self._raw = gid_to_raw(val)

    @property
    def raw(self):
        return self._raw

    def __str__(self):
        return raw_to_str(self._raw)

    def __eq__(self, other):
        if isinstance(other, GID):
            return self._raw == other._raw
        return NotImplemented

    def __hash__(self):
        return hash(self._raw)


class GRH(PyverbsObject):
    """ibv_grh: the 40-byte global route header of a received UD datagram."""

    def __init__(self, sgid=None, dgid=None, version_tclass_flow=0, paylen=0, next_hdr=0,
                 hop_limit=1):
        super().__init__()
        self._sgid = gid_to_raw(sgid) if sgid is not None else bytes(16)
        self._dgid = gid_to_raw(dgid) if dgid is not None else bytes(16)
        self.version_tclass_flow = version_tclass_flow
        self.paylen = paylen
        self.next_hdr = next_hdr
        self.hop_limit = hop_limit

    @property
    def dgid(self):
        return raw_to_str(self._dgid)

    @dgid.setter
    def dgid(self, val):
        self._dgid = gid_to_raw(val)

    @property
    def sgid(self):
        return raw_to_str(self._sgid)

    @sgid.setter
    def sgid(self, val):
        self._sgid = gid_to_raw(val)

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('DGID', self.dgid) + f.format('SGID', self.sgid) +
                f.format('version tclass flow', self.version_tclass_flow) +
                f.format('paylen', self.paylen) + f.format('next header', self.next_hdr) +
                f.format('hop limit', self.hop_limit))


class GlobalRoute(PyverbsObject):
    """ibv_global_route: the GRH fields an address vector sends with."""

    def __init__(self, dgid=None, flow_label=0, sgid_index=0, hop_limit=1, traffic_class=0):
        super().__init__()
        self._dgid = gid_to_raw(dgid) if dgid is not None else bytes(16)
        self.flow_label = flow_label
        self.sgid_index = sgid_index
        self.hop_limit = hop_limit
        self.traffic_class = traffic_class

    @property
    def dgid(self):
        return raw_to_str(self._dgid)

    @dgid.setter
    def dgid(self, val):
        self._dgid = gid_to_raw(val)

    def __str__(self):
        f = '{:22}: {:<20}\n'
        return (f.format('DGID', self.dgid) + f.format('flow label', self.flow_label) +
                f.format('sgid index', self.sgid_index) + f.format('hop limit', self.hop_limit) +
                f.format('traffic class', self.traffic_class))


class AHAttr(PyverbsObject):
    """ibv_ah_attr.  The GRH fields (dgid, flow_label, ...) read as None unless is_global."""

    def __init__(self, dlid=0, sl=0, src_path_bits=0, static_rate=0, is_global=0, port_num=1,
                 gr=None):
        super().__init__()
        self.port_num = port_num
        self.sl = sl
        self.src_path_bits = src_path_bits
        self.dlid = dlid
        self.static_rate = static_rate
        self.is_global = is_global
        self._dgid = bytes(16)
        self._flow_label = 0
        self._sgid_index = 0
        self._hop_limit = 0
        self._traffic_class = 0
        if is_global:
            if gr is None:
                raise PyverbsUserError('Global AH Attr is created but gr parameter is None')
            self._dgid = gr._dgid
            self._flow_label = gr.flow_label
            self._sgid_index = gr.sgid_index
            self._hop_limit = gr.hop_limit
            self._traffic_class = gr.traffic_class

    def _copy(self) -> "AHAttr":
        c = AHAttr(self.dlid, self.sl, self.src_path_bits, self.static_rate, 0, self.port_num)
        c.is_global = self.is_global
        c._dgid, c._flow_label, c._sgid_index = self._dgid, self._flow_label, self._sgid_index
        c._hop_limit, c._traffic_class = self._hop_limit, self._traffic_class
        return c

    @property
    def dgid(self):
        if self.is_global:
            return raw_to_str(self._dgid)

    @dgid.setter
    def dgid(self, val):
        if self.is_global:
            self._dgid = gid_to_raw(val)

    @property
    def flow_label(self):
        if self.is_global:
            return self._flow_label

    @flow_label.setter
    def flow_label(self, val):
        self._flow_label = val

    @property
    def sgid_index(self):
        if self.is_global:
            return self._sgid_index

    @sgid_index.setter
    def sgid_index(self, val):
        self._sgid_index = val

    @property
    def hop_limit(self):
        if self.is_global:
            return self._hop_limit

    @hop_limit.setter
    def hop_limit(self, val):
        self._hop_limit = val

    @property
    def traffic_class(self):
        if self.is_global:
            return self._traffic_class

    @traffic_class.setter
    def traffic_class(self, val):
        self._traffic_class = val

    def __str__(self):
        f = '  {:22}: {:<20}\n'
        g = ''
        if self.is_global:
            g = (f.format('dgid', self.dgid) + f.format('flow label', self.flow_label) +
                 f.format('sgid index', self.sgid_index) + f.format('hop limit', self.hop_limit) +
                 f.format('traffic_class', self.traffic_class))
        return (f.format('port num', self.port_num) + f.format('sl', self.sl) +
                f.format('source path bits', self.src_path_bits) + f.format('dlid', self.dlid) +
                f.format('static rate', self.static_rate) + f.format('is global', self.is_global) +
                g)


def engine_ah(attr: AHAttr, what: str = 'AH') -> _EngineAH:
    """Check an address vector as a RoCE port would and turn it into the engine's."""
    if not attr.is_global:
        raise rdma_error(f'{what}: a RoCE address vector needs a GRH (is_global=1)')
    if attr.port_num != 1:
        raise rdma_error(f'{what}: port {attr.port_num} does not exist')
    if not 0 <= attr._sgid_index < GID_POPULATED:
        raise rdma_error(f'{what}: sgid_index {attr._sgid_index} is not a GID of the port')
    dgid = str(ipaddress.IPv6Address(attr._dgid))
    ah = _EngineAH(dgid=dgid, port=_nic.port_for_gid(dgid), sl=attr.sl,
                   traffic_class=attr._traffic_class, hop_limit=attr._hop_limit,
                   flow_label=attr._flow_label, sgid_index=attr._sgid_index,
                   port_num=attr.port_num)
    try:
        ah.addr                 # a GID that names no peer (::, link-local)
    except VerbsError as e:
        raise rdma_error(f'{what}: {e}') from None
    return ah


def ahattr_from_engine(ah: _EngineAH) -> AHAttr:
    """The pyverbs view of an engine address vector (global, as all RoCE ones are)."""
    if ah.dgid in ('::', ''):
        return AHAttr(port_num=ah.port_num)
    gr = GlobalRoute(dgid=GID(ah.dgid), flow_label=ah.flow_label, sgid_index=ah.sgid_index,
                     hop_limit=ah.hop_limit, traffic_class=ah.traffic_class)
    return AHAttr(sl=ah.sl, is_global=1, port_num=ah.port_num, gr=gr)


class AH(PyverbsCM):
    """An address handle, made from an AHAttr (``attr=``) or from a received work
    completion and the GRH at the start of its buffer (``wc=``, ``grh=``, ``port_num=``)."""

    _kind = 'AH'

    def __init__(self, pd, **kwargs):
        super().__init__()
        self._closed = True
        if len(kwargs) == 1:
            attr = kwargs['attr']
        else:
            attr = _attr_from_wc(kwargs['wc'], kwargs['grh'], kwargs['port_num'])
        if pd is None or pd._closed:
            raise rdma_error('Failed to create AH: the PD is closed')
        self._engine = engine_ah(attr, 'Failed to create AH')
        self._attr = attr._copy()
        self.pd = pd
        self._nic = pd._nic
        self._closed = False
        pd.add_ref(self)

    def close(self):
        if not self._closed:
            self.logger.debug('Closing AH')
            self._closed = True
            self.pd = None


def _attr_from_wc(wc, grh, port_num) -> AHAttr:
    """ibv_init_ah_from_wc for RoCEv2 over IPv4: the IPv4 header sits in the last
    20 bytes of the GRH area, its source address names the sender."""
    from .libibverbs_enums import IBV_WC_GRH
    if not wc.wc_flags & IBV_WC_GRH:
        raise rdma_error('Failed to create AH: the work completion carries no GRH')
    if isinstance(grh, GRH):
        dgid = grh._sgid
        tclass, hops = (grh.version_tclass_flow >> 20) & 0xFF, grh.hop_limit
    else:
        hdr = ctypes.string_at(int(grh), 40)
        ip4 = hdr[20:40]
        if hdr[0] >> 4 == 6:                    # RoCEv2 over IPv6: the IPv6 header
            dgid = hdr[8:24]
            tclass, hops = (int.from_bytes(hdr[0:4], 'big') >> 20) & 0xFF, hdr[7]
        elif ip4[0] >> 4 == 4:
            dgid = ipaddress.IPv6Address(b'\0' * 10 + b'\xff\xff' + ip4[12:16]).packed
            tclass, hops = ip4[1], ip4[8]
        else:
            raise rdma_error('Failed to create AH: no IP header in the GRH', errno.EINVAL)
    gr = GlobalRoute(dgid=GID(dgid), sgid_index=0, hop_limit=hops, traffic_class=tclass)
    return AHAttr(sl=wc.sl, is_global=1, port_num=port_num, gr=gr)
