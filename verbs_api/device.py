"""Devices and contexts (``pyverbs.device``).

``get_device_list()`` lists the softnic devices this process is configured
with (``SOFTNIC_DEVICES``; two by default); ``Context(name=...)`` opens one,
which binds its UDP socket and starts its progress thread.  Queries answer
with what the device really does: one port, Ethernet link layer, RoCEv2 GID
``::ffff:a.b.c.d`` of the device's IPv4 address (an IPv6 device's own address),
the engine's limits.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
import weakref

import softnic
import softnic.driver.nic as _nic
from softnic.driver import mcast as _mcast
from softnic.core.device import port_speed
from softnic.core.errors import VerbsError

from . import enums as e
from .addr import GID, GID_POPULATED, GID_TABLE_LEN, raw_to_str
from .base import PyverbsCM, PyverbsObject, close_weakrefs, keep_ref, rdma_error
from .pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError
from .utils import gid_str

VENDOR_ID = 0xFFFFFF            # as Linux soft-RoCE reports: no IEEE OUI
VENDOR_PART_ID = 0
PKEY_DEFAULT = 0xFFFF

_MTU_ENUM = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
             2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}


def _be64_raw(v: int) -> int:
    # a __be64 field as pyverbs shows it: big-endian memory read as a host int
    return int.from_bytes(v.to_bytes(8, 'big'), sys.byteorder)


class _Attrs(PyverbsObject):
    """A read-mostly attribute record; fields not given are 0, like a zeroed C struct."""
    _fields: tuple = ()

    def __init__(self, **kw):
        super().__init__()
        for f in self._fields:
            setattr(self, f, kw.pop(f, 0))
        if kw:
            raise TypeError(f'unknown fields {sorted(kw)}')


class Device(PyverbsObject):
    """An entry of get_device_list(): name (bytes), node and transport type, GUID, index."""

    def __init__(self, name, guid, node_type, transport_type, index=0):
        super().__init__()
        self._name = name
        self._guid = guid
        self._node_type = node_type
        self._transport_type = transport_type
        self._index = index

    @property
    def name(self):
        return self._name

    @property
    def node_type(self):
        return self._node_type

    @property
    def transport_type(self):
        return self._transport_type

    @property
    def guid(self):
        return self._guid

    @property
    def index(self):
        return self._index

    def __str__(self):
        return (f'Device {self.name.decode()}, node type {translate_node_type(self.node_type)}, '
                f'transport type {translate_transport_type(self.transport_type)}, '
                f'guid {guid_to_hex(self.guid)}, index {self._index}')


def get_device_list():
    """Every configured device; a ``transport=tcp`` device is an iWARP RNIC, as siw is."""
    cfg = _nic.runtime_config()
    out = []
    for i, n in enumerate(_nic.device_names()):
        iwarp = cfg.transport_of(n) == 'tcp'
        out.append(Device(n.encode(), _nic.node_guid(n),
                          e.IBV_NODE_RNIC if iwarp else e.IBV_NODE_CA,
                          e.IBV_TRANSPORT_IWARP if iwarp else e.IBV_TRANSPORT_IB, i))
    return out


_fork_hook = []


def _forget_devices_in_children() -> None:
    """Once the Python face opens a device: a child of fork() opens devices of its own
    (``softnic.driver.nic.forget_after_fork``); the parent's objects stay the parent's."""
    if not _fork_hook:
        _fork_hook.append(True)
        os.register_at_fork(after_in_child=_nic.forget_after_fork)


class Context(PyverbsCM):
    """An open device (ibv_context).  ``Context(name='softnic0')``."""

    def __init__(self, **kwargs):
        super().__init__()
        _forget_devices_in_children()
        self._closed = True
        self.pds = weakref.WeakSet()
        self.dms = weakref.WeakSet()
        self.ccs = weakref.WeakSet()
        self.cqs = weakref.WeakSet()
        self.qps = weakref.WeakSet()
        self.xrcds = weakref.WeakSet()
        self.vars = weakref.WeakSet()
        name = kwargs.get('name')
        self._cmd_fd = -1
        cmd_fd = kwargs.get('cmd_fd')
        if cmd_fd is not None:          # ibv_import_device: the context this fd belongs to
            try:
                st = os.fstat(cmd_fd)
            except OSError as ex:
                raise PyverbsRDMAError('Failed to import device', ex.errno) from None
            name = _CMD_FDS.get((st.st_dev, st.st_ino))
            if name is None:
                raise PyverbsRDMAError('Failed to import device', errno.EOPNOTSUPP)
            self._cmd_fd = cmd_fd
            self._file = (st.st_dev, st.st_ino)
        for k in ('cmid', 'attr'):
            if kwargs.get(k) is not None:
                raise PyverbsRDMAError(f'Context({k}=...) is not supported by softnic',
                                       errno.EOPNOTSUPP)
        if name is None:
            raise PyverbsUserError('Device name must be provided')
        if isinstance(name, bytes):
            name = name.decode()
        self.name = name
        if name not in _nic.device_names():
            raise PyverbsRDMAError(f'Failed to find device {name}')
        try:
            self._nic = _nic.open_device(name)
        except OSError as ex:
            raise PyverbsRDMAError(f'Failed to open device {name}: {ex}',
                                   ex.errno or errno.EIO) from None
        except ValueError as ex:            # a configuration that cannot work, e.g. tcp on sim
            raise PyverbsRDMAError(f'Failed to open device {name}: {ex}', errno.EINVAL) from None
        self._events_taken = 0
        if self._cmd_fd < 0:
            # the context's command fd: a memfd of its own, so a dup of it names this device
            # when imported (Context(cmd_fd=...))
            self._cmd_fd = os.memfd_create(f'softnic-{name}', os.MFD_CLOEXEC)
            st = os.fstat(self._cmd_fd)
            self._file = (st.st_dev, st.st_ino)
            _CMD_FDS[self._file] = name
        self._closed = False
        self.logger.debug(f'Context: opened device {name}')

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing Context')
        close_weakrefs([self.qps, self.ccs, self.cqs, self.dms, self.pds, self.xrcds, self.vars])
        self._closed = True
        if self._cmd_fd >= 0:
            os.close(self._cmd_fd)
            self._cmd_fd = -1
        self._nic.release()

    def _check(self):
        if self._closed:
            raise PyverbsError(f'Context of {self.name} is closed')

    @property
    def cmd_fd(self):
        return self._cmd_fd

    def _share(self, kind, handle, obj):
        """Make ``obj`` (a PD or MR created through this context) importable by
        ``handle`` from every context of this command file (``PD(handle=...)``,
        ``MR(handle=...)``), as long as it lives."""
        _SHARED.setdefault(self._file, weakref.WeakValueDictionary())[(kind, handle)] = obj

    def _imported(self, kind, handle, what):
        """The live ``kind`` object of this context's command file named by ``handle``:
        ibv_import_pd / ibv_import_mr's lookup, ENOENT for a handle the file does not
        hold and EINVAL for a handle of another kind, as the kernel answers."""
        self._check()
        objs = _SHARED.get(self._file, {})
        obj = objs.get((kind, handle))
        if obj is None or obj._closed:
            other = any(k != kind and h == handle and not o._closed
                        for (k, h), o in list(objs.items()))
            raise PyverbsRDMAError(f'Failed to import {what}',
                                   errno.EINVAL if other else errno.ENOENT)
        return obj

    @property
    def num_comp_vectors(self):
        return os.cpu_count() or 1

    @property
    def guid(self):
        return _nic.node_guid(self.name)

    @property
    def nic(self):
        """softnic's own (pyverbs has no such attribute): the device behind this
        context (``softnic.driver.nic.NIC``, or a simulated one), whose counters,
        transport and data path softnic's tools report."""
        return self._nic

    def query_device(self):
        self._check()
        cfg = self._nic.dev.config
        return DeviceAttr(
            fw_version=softnic.__dict__.get('__version__', '0.1.0'),
            node_guid=_be64_raw(self.guid), sys_image_guid=_be64_raw(self.guid),
            max_mr_size=cfg.max_mr_size, page_size_cap=0xFFFFF000, vendor_id=VENDOR_ID,
            vendor_part_id=VENDOR_PART_ID, hw_ver=0, max_qp=cfg.max_qp,
            max_qp_wr=cfg.max_qp_wr, device_cap_flags=int(DEVICE_CAP_FLAGS),
            max_sge=cfg.max_sge, max_sge_rd=cfg.max_sge, max_cq=cfg.max_qp,
            max_cqe=cfg.max_cqe, max_mr=1 << 20, max_pd=1 << 16,
            max_qp_rd_atom=cfg.max_rd_atomic, max_ee_rd_atom=0,
            max_res_rd_atom=cfg.max_qp * cfg.max_rd_atomic,
            max_qp_init_rd_atom=cfg.max_rd_atomic, max_ee_init_rd_atom=0,
            atomic_caps=e.IBV_ATOMIC_HCA, max_ee=0, max_rdd=0, max_mw=1 << 20, max_raw_ipv6_qps=0,
            max_raw_ethy_qp=0, max_mcast_grp=_mcast.MAX_MCAST_GRP,
            max_mcast_qp_attach=_mcast.MAX_MCAST_QP_ATTACH,
            max_total_mcast_qp_attach=_mcast.MAX_TOTAL_MCAST_QP_ATTACH, max_ah=1 << 20, max_fmr=0, max_map_per_fmr=0,
            max_srq=cfg.max_qp, max_srq_wr=cfg.max_qp_wr, max_srq_sge=cfg.max_sge,
            max_pkeys=1, local_ca_ack_delay=15, phys_port_cnt=1)

    def query_device_ex(self, ex_input=None):
        orig = self.query_device()
        return DeviceAttrEx(
            orig_attr=orig, comp_mask=0, odp_caps=_odp_caps(), completion_timestamp_mask=0,
            hca_core_clock=0, device_cap_flags_ex=orig.device_cap_flags, tso_caps=TSOCaps(),
            pci_atomic_caps=PCIAtomicCaps(), rss_caps=RSSCaps(), max_wq_type_rq=0,
            packet_pacing_caps=PacketPacingCaps(), raw_packet_caps=0, tm_caps=TMCaps(),
            cq_mod_caps=CQModerationCaps(), max_dm_size=self._nic.dev.keys.dm.size,
            phys_port_cnt_ex=1)

    def _port(self, port_num, what):
        self._check()
        if port_num != 1:
            if what == 'attributes':        # pyverbs' own message for ibv_query_port
                raise rdma_error(f'Failed to query port {port_num}')
            raise rdma_error(f'Failed to query {what} of port {port_num}: no such port')

    def query_port(self, port_num):
        self._port(port_num, 'attributes')
        cfg = self._nic.dev.config
        with self._nic.lock:
            c = self._nic.dev.counters
            bad_pkey, bad_qkey = c.get('rcvd_bad_pkey', 0), c.get('rcvd_bad_qkey', 0)
        speed, width = port_speed(cfg.line_rate_bps)
        return PortAttr(
            state=e.IBV_PORT_ACTIVE, max_mtu=e.IBV_MTU_4096,
            active_mtu=_MTU_ENUM.get(cfg.active_mtu, e.IBV_MTU_4096), gid_tbl_len=GID_TABLE_LEN,
            port_cap_flags=int(e.IBV_PORT_CM_SUP | e.IBV_PORT_IP_BASED_GIDS),
            max_msg_sz=min(cfg.max_msg_size, 0xFFFFFFFF), bad_pkey_cntr=bad_pkey,
            qkey_viol_cntr=bad_qkey, pkey_tbl_len=1, lid=0, sm_lid=0, lmc=0, max_vl_num=1,
            sm_sl=0, subnet_timeout=0, init_type_reply=0, active_width=width, active_speed=speed,
            active_speed_ex=0, phys_state=5, link_layer=e.IBV_LINK_LAYER_ETHERNET, flags=0, port_cap_flags2=0)

    def get_pkey_index(self, port_num, pkey):
        """ibv_get_pkey_index: the index of ``pkey`` in the port's P_Key table (one entry,
        the default P_Key 0xFFFF, the same in either byte order)."""
        self._check()
        if port_num != 1 or pkey != PKEY_DEFAULT:
            raise PyverbsRDMAError(f'Failed to get pkey index of pkey = {pkey} of port '
                                   f'{port_num}')
        return 0

    def query_port_speed(self, port_num):
        """ibv_query_port_speed (rdma-core 64): EOPNOTSUPP, libibverbs' answer for a
        provider without it (rxe); query_port's active_width and active_speed say it."""
        self._port(port_num, 'speed')
        raise PyverbsRDMAError(f'Failed to query port speed for port {port_num}',
                               errno.EOPNOTSUPP)

    def query_pkey(self, port_num, index):
        self._port(port_num, 'pkey')
        if index != 0:
            raise rdma_error(f'Failed to query pkey {index} of port {port_num}')
        return PKEY_DEFAULT

    def query_gid(self, port_num, index):
        self._port(port_num, 'gid')
        if not 0 <= index < GID_TABLE_LEN:
            raise rdma_error(f'Failed to query gid {index} of port {port_num}')
        if index >= GID_POPULATED:
            return GID()                     # an empty entry reads as zeros
        return GID(self._nic.gid)

    def query_gid_type(self, port_num, index):
        self._port(port_num, 'gid type')
        if not 0 <= index < GID_TABLE_LEN:
            raise rdma_error(f'Failed to query gid type of port {port_num} and gid index {index}')
        if index >= GID_POPULATED:
            return e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1     # libibverbs' answer for an empty entry
        return e.IBV_GID_TYPE_SYSFS_ROCE_V2

    def _gid_entry(self, index):
        raw = GID(self._nic.gid).raw
        try:
            ifindex = socket.if_nametoindex('lo') if self._nic.ip.startswith('127.') else 0
        except OSError:
            ifindex = 0
        return GIDEntry(int.from_bytes(raw[:8], sys.byteorder),
                        int.from_bytes(raw[8:], sys.byteorder), index, 1,
                        e.IBV_GID_TYPE_ROCE_V2, ifindex)

    def query_gid_table(self, max_entries, flags=0):
        self._check()
        if max_entries < GID_POPULATED:
            # ibv_query_gid_table returns -EINVAL, which pyverbs passes on as the code
            raise rdma_error('Failed to query gid tables of the device: more than '
                             f'{max_entries} entries', -errno.EINVAL)
        return [self._gid_entry(i) for i in range(GID_POPULATED)]     # the populated ones

    def query_gid_ex(self, port_num, gid_index, flags=0):
        self._port(port_num, 'gid table')
        if not 0 <= gid_index < GID_TABLE_LEN:
            raise rdma_error(f'Failed to query gid table of port {port_num} in index {gid_index}')
        if gid_index >= GID_POPULATED:
            raise rdma_error(f'Failed to query gid table of port {port_num} in index {gid_index}',
                             errno.ENODATA)
        return self._gid_entry(gid_index)

    def query_rt_values_ex(self, comp_mask=e.IBV_VALUES_MASK_RAW_CLOCK):
        self._check()
        ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
        return ns // 1_000_000_000, ns % 1_000_000_000

    def get_async_event(self):
        """Block until the device raises an asynchronous event; returns it."""
        self._check()
        dev = self._nic.dev
        got = []

        def take():
            if self._closed:
                return True
            if dev.events:
                got.append(dev.events.popleft())
                return True
            return False

        self._nic.wait_until(take)
        if not got:
            raise rdma_error('Failed to get async event', errno.EIO)
        kind, element = got[0]
        ev = AsyncEvent(int(kind))
        ev._element = element
        return ev

    _REFS = (('PD', 'pds'), ('DM', 'dms'), ('CompChannel', 'ccs'), ('CQ', 'cqs'),
             ('CQEX', 'cqs'), ('QP', 'qps'))

    def add_ref(self, obj):
        keep_ref(self, obj, self._REFS)


def _odp_caps():
    """On-demand paging is what softnic always does: it never pins, the engine reaches an
    MR through the process's own mapping when a packet needs it, and an implicit MR (the
    whole address space) reaches any address the mapping allows.  The C face reports
    the same caps."""
    rc = (e.IBV_ODP_SUPPORT_SEND | e.IBV_ODP_SUPPORT_RECV | e.IBV_ODP_SUPPORT_WRITE |
          e.IBV_ODP_SUPPORT_READ | e.IBV_ODP_SUPPORT_ATOMIC | e.IBV_ODP_SUPPORT_SRQ_RECV)
    uc = e.IBV_ODP_SUPPORT_SEND | e.IBV_ODP_SUPPORT_RECV | e.IBV_ODP_SUPPORT_WRITE
    ud = e.IBV_ODP_SUPPORT_SEND | e.IBV_ODP_SUPPORT_RECV
    return ODPCaps(general_caps=int(e.IBV_ODP_SUPPORT | e.IBV_ODP_SUPPORT_IMPLICIT),
                   rc_odp_caps=int(rc), uc_odp_caps=int(uc),
                   ud_odp_caps=int(ud), xrc_odp_caps=int(rc))


DEVICE_CAP_FLAGS = (e.IBV_DEVICE_BAD_PKEY_CNTR | e.IBV_DEVICE_BAD_QKEY_CNTR |
                    e.IBV_DEVICE_CURR_QP_STATE_MOD | e.IBV_DEVICE_PORT_ACTIVE_EVENT |
                    e.IBV_DEVICE_SYS_IMAGE_GUID | e.IBV_DEVICE_RC_RNR_NAK_GEN |
                    e.IBV_DEVICE_SRQ_RESIZE | e.IBV_DEVICE_MEM_WINDOW |
                    e.IBV_DEVICE_MEM_WINDOW_TYPE_2B | e.IBV_DEVICE_XRC)


class DeviceAttr(_Attrs):
    """ibv_device_attr, read as pyverbs names its fields."""
    _fields = ('fw_version', 'node_guid', 'sys_image_guid', 'max_mr_size', 'page_size_cap',
               'vendor_id', 'vendor_part_id', 'hw_ver', 'max_qp', 'max_qp_wr',
               'device_cap_flags', 'max_sge', 'max_sge_rd', 'max_cq', 'max_cqe', 'max_mr',
               'max_pd', 'max_qp_rd_atom', 'max_ee_rd_atom', 'max_res_rd_atom',
               'max_qp_init_rd_atom', 'max_ee_init_rd_atom', 'atomic_caps', 'max_ee', 'max_rdd',
               'max_mw', 'max_raw_ipv6_qps', 'max_raw_ethy_qp', 'max_mcast_grp',
               'max_mcast_qp_attach', 'max_total_mcast_qp_attach', 'max_ah', 'max_fmr',
               'max_map_per_fmr', 'max_srq', 'max_srq_wr', 'max_srq_sge', 'max_pkeys',
               'local_ca_ack_delay', 'phys_port_cnt')

    def __str__(self):
        f = '{:<22}: {:<20}\n'
        rows = [('FW version', self.fw_version), ('Node guid', guid_format(self.node_guid)),
                ('Sys image GUID', guid_format(self.sys_image_guid)),
                ('Max MR size', hex(self.max_mr_size)), ('Page size cap', hex(self.page_size_cap)),
                ('Vendor ID', hex(self.vendor_id)), ('Vendor part ID', self.vendor_part_id),
                ('HW version', self.hw_ver), ('Max QP', self.max_qp),
                ('Max QP WR', self.max_qp_wr),
                ('Device cap flags', translate_device_caps(self.device_cap_flags)),
                ('Max SGE', self.max_sge), ('Max SGE RD', self.max_sge_rd),
                ('MAX CQ', self.max_cq), ('Max CQE', self.max_cqe), ('Max MR', self.max_mr),
                ('Max PD', self.max_pd), ('Max QP RD atom', self.max_qp_rd_atom),
                ('Max EE RD atom', self.max_ee_rd_atom),
                ('Max res RD atom', self.max_res_rd_atom),
                ('Max QP init RD atom', self.max_qp_init_rd_atom),
                ('Max EE init RD atom', self.max_ee_init_rd_atom),
                ('Atomic caps', self.atomic_caps), ('Max EE', self.max_ee),
                ('Max RDD', self.max_rdd), ('Max MW', self.max_mw),
                ('Max raw IPv6 QPs', self.max_raw_ipv6_qps),
                ('Max raw ethy QP', self.max_raw_ethy_qp),
                ('Max mcast group', self.max_mcast_grp),
                ('Max mcast QP attach', self.max_mcast_qp_attach), ('Max AH', self.max_ah),
                ('Max FMR', self.max_fmr), ('Max map per FMR', self.max_map_per_fmr),
                ('Max SRQ', self.max_srq), ('Max SRQ WR', self.max_srq_wr),
                ('Max SRQ SGE', self.max_srq_sge), ('Max PKeys', self.max_pkeys),
                ('local CA ack delay', self.local_ca_ack_delay),
                ('Phys port count', self.phys_port_cnt)]
        return ''.join(f.format(k, v) for k, v in rows)


class FdArr(PyverbsObject):
    """ibv_fd_arr: a list of file descriptors (mlx5's DevX objects take one)."""

    def __init__(self, arr=(), count=0):
        super().__init__()
        self.arr, self.count = [int(fd) for fd in list(arr)[:count]], count

    def __str__(self):
        return (f"{'Number of fd in arr':20}: {self.count:<20}\n"
                f"{'FDs in arr':20}: {self.arr!s:<20}\n")


class QueryDeviceExInput(PyverbsObject):
    def __init__(self, comp_mask):
        super().__init__()
        self.comp_mask = comp_mask


class ODPCaps(_Attrs):
    _fields = ('general_caps', 'rc_odp_caps', 'uc_odp_caps', 'ud_odp_caps', 'xrc_odp_caps')


class PCIAtomicCaps(_Attrs):
    _fields = ('fetch_add', 'swap', 'compare_swap')


class TSOCaps(_Attrs):
    _fields = ('max_tso', 'supported_qpts')


class RSSCaps(_Attrs):
    _fields = ('supported_qpts', 'max_rwq_indirection_tables', 'rx_hash_fields_mask',
               'rx_hash_function', 'max_rwq_indirection_table_size')


class PacketPacingCaps(_Attrs):
    _fields = ('qp_rate_limit_min', 'qp_rate_limit_max', 'supported_qpts')


class TMCaps(_Attrs):
    _fields = ('max_rndv_hdr_size', 'max_num_tags', 'flags', 'max_ops', 'max_sge')


class CQModerationCaps(_Attrs):
    _fields = ('max_cq_count', 'max_cq_period')


class DeviceAttrEx(_Attrs):
    """ibv_device_attr_ex: ``orig_attr`` plus the extended capabilities (none of the
    optional offloads: no ODP, TSO, RSS, tag matching or device memory)."""
    _fields = ('orig_attr', 'comp_mask', 'odp_caps', 'completion_timestamp_mask',
               'hca_core_clock', 'device_cap_flags_ex', 'tso_caps', 'pci_atomic_caps',
               'rss_caps', 'max_wq_type_rq', 'packet_pacing_caps', 'raw_packet_caps', 'tm_caps',
               'cq_mod_caps', 'max_dm_size', 'phys_port_cnt_ex')


class PortAttr(_Attrs):
    """ibv_port_attr."""
    _fields = ('state', 'max_mtu', 'active_mtu', 'gid_tbl_len', 'port_cap_flags', 'max_msg_sz',
               'bad_pkey_cntr', 'qkey_viol_cntr', 'pkey_tbl_len', 'lid', 'sm_lid', 'lmc',
               'max_vl_num', 'sm_sl', 'subnet_timeout', 'init_type_reply', 'active_width',
               'active_speed', 'active_speed_ex', 'phys_state', 'link_layer', 'flags',
               'port_cap_flags2')

    def __str__(self):
        f = '{:<24}: {:<20}\n'
        rows = [('Port state', port_state_to_str(self.state)),
                ('Max MTU', translate_mtu(self.max_mtu)),
                ('Active MTU', translate_mtu(self.active_mtu)), ('SM lid', self.sm_lid),
                ('Port lid', self.lid), ('lmc', hex(self.lmc)),
                ('Link layer', translate_link_layer(self.link_layer)),
                ('Max message size', hex(self.max_msg_sz)),
                ('Port cap flags', translate_port_cap_flags(self.port_cap_flags)),
                ('Port cap flags 2', translate_port_cap_flags2(self.port_cap_flags2)),
                ('max VL num', self.max_vl_num), ('Bad Pkey counter', self.bad_pkey_cntr),
                ('Qkey violations counter', self.qkey_viol_cntr),
                ('GID table len', self.gid_tbl_len), ('Pkey table len', self.pkey_tbl_len),
                ('SM sl', self.sm_sl), ('Subnet timeout', self.subnet_timeout),
                ('Init type reply', self.init_type_reply),
                ('Active width', width_to_str(self.active_width)),
                ('Active speed', speed_to_str(self.active_speed, self.active_speed_ex)),
                ('Phys state', phys_state_to_str(self.phys_state)), ('Flags', self.flags)]
        return ''.join(f.format(k, v) for k, v in rows)


class GIDEntry(PyverbsObject):
    """ibv_gid_entry.  The two GID halves read as stored (big-endian memory as host ints)."""

    def __init__(self, subnet_prefix=0, interface_id=0, gid_index=0, port_num=0, gid_type=0,
                 ndev_ifindex=0):
        super().__init__()
        self._sp, self._iid = subnet_prefix, interface_id
        self._gid_index, self._port_num = gid_index, port_num
        self._gid_type, self._ndev_ifindex = gid_type, ndev_ifindex

    @property
    def gid_subnet_prefix(self):
        return self._sp

    @property
    def gid_interface_id(self):
        return self._iid

    @property
    def gid_index(self):
        return self._gid_index

    @property
    def port_num(self):
        return self._port_num

    @property
    def gid_type(self):
        return self._gid_type

    @property
    def ndev_ifindex(self):
        return self._ndev_ifindex

    def gid_str(self):
        return gid_str(self._sp, self._iid)

    def __str__(self):
        f = '{:<24}: {:<20}\n'
        return (f.format('GID', self.gid_str()) + f.format('GID Index', self.gid_index) +
                f.format('Port number', self.port_num) +
                f.format('GID type', translate_gid_type(self.gid_type)) +
                f.format('Ndev ifindex', self.ndev_ifindex))


class AsyncEvent(PyverbsObject):
    def __init__(self, event_type=0):
        super().__init__()
        self._event_type = event_type
        self._element = None

    def ack(self):
        pass

    @property
    def event_type(self):
        return self._event_type

    def __str__(self):
        return '{:<24}: {:<20}\n'.format('Event Type', translate_event_type(self._event_type))


_CMD_FDS: dict = {}        # (st_dev, st_ino) of a context's command fd -> its device name
_SHARED: dict = {}         # (st_dev, st_ino) -> {(kind, handle): PD or MR created there}


class AllocDmAttr(PyverbsObject):
    def __init__(self, length, log_align_req=0, comp_mask=0):
        super().__init__()
        self.length = length
        self.log_align_req = log_align_req
        self.comp_mask = comp_mask


class DM(PyverbsCM):
    """Device memory (ibv_alloc_dm): memory on the NIC, emulated as a buffer the device
    owns (max_dm_size bytes per device); read and written with copy_from_dm / copy_to_dm
    in 4-byte words, and reached by the wire through a zero-based DMMR over it."""

    _kind = 'DM'

    def __init__(self, context, dm_attr=None, **kwargs):
        super().__init__()
        self._closed = True
        self.dm_mrs = weakref.WeakSet()
        self._is_imported = False
        context._check()
        self._nic = context._nic
        handle = kwargs.get('handle')
        if handle is not None:
            self._edm = self._nic.dev.keys.dm.by_handle.get(handle)
            if self._edm is None:
                raise PyverbsRDMAError('Failed to import DM', errno.EINVAL)
            self._is_imported = True
        else:
            max_size = self._nic.dev.keys.dm.size
            if dm_attr is None:
                raise PyverbsUserError('DM needs an AllocDmAttr')
            msg = (f'Failed to allocate device memory of size {dm_attr.length}. Max available '
                   f'size {max_size}.')
            if dm_attr.length > max_size:
                raise PyverbsRDMAError(msg, errno.ENOMEM)
            # no engine lock: the pool is the device's own, and a forked child allocates too
            try:
                self._edm = self._nic.dev.keys.dm.alloc(int(dm_attr.length),
                                                       int(dm_attr.log_align_req),
                                                       int(dm_attr.comp_mask))
            except VerbsError as ex:
                raise PyverbsRDMAError(msg, ex.errno) from None
        self.context = context
        self._closed = False
        context.dms.add(self)

    def unimport(self):
        self.close()

    def close(self):
        if self._closed:
            return
        self.logger.debug('Closing DM')
        close_weakrefs([self.dm_mrs])
        self._closed = True
        if not self._is_imported:
            try:
                self._edm.pool.free(self._edm)
            except VerbsError as ex:
                raise PyverbsRDMAError('Failed to free dm', ex.errno) from None
        self.context = None

    def add_ref(self, obj):
        self.dm_mrs.add(obj)

    def copy_to_dm(self, dm_offset, data, length):
        if self._closed:
            raise PyverbsRDMAError('Failed to copy to dm', errno.EINVAL)
        if isinstance(data, str):
            data = data.encode()
        data = bytes(memoryview(data).cast('B')[:length]).ljust(length, b'\0')
        try:
            self._edm.copy_to(int(dm_offset), data)
        except VerbsError as ex:
            raise PyverbsRDMAError('Failed to copy to dm', ex.errno) from None

    def copy_from_dm(self, dm_offset, length):
        if self._closed:
            raise PyverbsRDMAError('Failed to copy from dm', errno.EINVAL)
        try:
            return self._edm.copy_from(int(dm_offset), int(length))
        except VerbsError as ex:
            raise PyverbsRDMAError('Failed to copy from dm', ex.errno) from None

    def export_dmabuf_fd(self):
        raise PyverbsRDMAError('Failed to export dmabuf FD for DM', errno.EOPNOTSUPP)

    @property
    def handle(self):
        return self._edm.handle


def translate_gid_type(gid_type):
    return {e.IBV_GID_TYPE_IB: 'IB', e.IBV_GID_TYPE_ROCE_V1: 'RoCEv1',
            e.IBV_GID_TYPE_ROCE_V2: 'RoCEv2'}.get(gid_type, f'Unknown gid_type ({gid_type})')


def guid_format(num):
    """GUID text of a __be64 value as stored (changing its byte order first)."""
    h = '%016x' % int.from_bytes(num.to_bytes(8, sys.byteorder), 'big')
    return ':'.join(h[i:i + 4] for i in range(0, 16, 4))


def translate_transport_type(transport_type):
    return {0: 'IB', 1: 'IWARP', 2: 'USNIC', 3: 'USNIC UDP'}.get(transport_type, 'Unknown')


def translate_node_type(node_type):
    return {1: 'CA', 2: 'Switch', 3: 'Router', 4: 'RNIC', 5: 'USNIC',
            6: 'USNIC UDP'}.get(node_type, 'Unknown')


def guid_to_hex(node_guid):
    return hex(node_guid).replace('0x', '')


def port_state_to_str(port_state):
    names = {0: 'NOP', 1: 'Down', 2: 'Init', 3: 'Armed', 4: 'Active', 5: 'Defer'}
    if port_state in names:
        return f'{names[port_state]} ({port_state})'
    return f'Invalid state ({port_state})'


def translate_mtu(mtu):
    sizes = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
    return f'{sizes[mtu]} ({mtu})' if mtu in sizes else f'Invalid MTU ({mtu})'


def translate_link_layer(ll):
    return {0: 'Unspecified', 1: 'InfiniBand', 2: 'Ethernet'}.get(
        ll, f'Invalid link layer ({ll})')


def str_from_flags(flags, dictionary):
    out = '\n  '
    for bit, name in dictionary.items():
        if flags & bit:
            out += name + '\n  '
    return out


def _names(enum_cls):
    return {m.value: m.name for m in enum_cls}


def translate_port_cap_flags(flags):
    return str_from_flags(flags, _names(e.ibv_port_cap_flags))


def translate_port_cap_flags2(flags):
    return str_from_flags(flags, _names(e.ibv_port_cap_flags2))


def translate_device_caps(flags):
    return str_from_flags(flags, _names(e.ibv_device_cap_flags))


def phys_state_to_str(phys):
    names = {1: 'Sleep', 2: 'Polling', 3: 'Disabled', 4: 'Port configuration training',
             5: 'Link up', 6: 'Link error recovery', 7: 'Phy test'}
    return f'{names[phys]} ({phys})' if phys in names else 'Invalid physical state'


def width_to_str(width):
    names = {1: '1X', 2: '4X', 4: '8X', 16: '2X'}
    return f'{names[width]} ({width})' if width in names else 'Invalid width'


def speed_to_str(active_speed, active_speed_ex=0):
    """An IB speed code as pyverbs names it; ``active_speed_ex`` (rdma-core 64's, when
    nonzero) takes over from ``active_speed``."""
    speed = active_speed_ex or active_speed
    names = {0: '0.0 Gbps', 1: '2.5 Gbps', 2: '5.0 Gbps', 4: '5.0 Gbps', 8: '10.0 Gbps',
             16: '14.0 Gbps', 32: '25.0 Gbps', 64: '50.0 Gbps', 128: '100.0 Gbps',
             256: '200.0 Gbps'}
    return f'{names[speed]} ({speed})' if speed in names else 'Invalid speed'


def translate_event_type(event_type):
    try:
        return e.ibv_event_type(event_type).name
    except ValueError:
        return f'Unknown event_type ({event_type})'


__all__ = ['Device', 'Context', 'DeviceAttr', 'DeviceAttrEx', 'QueryDeviceExInput', 'ODPCaps',
           'PCIAtomicCaps', 'TSOCaps', 'RSSCaps', 'PacketPacingCaps', 'TMCaps',
           'CQModerationCaps', 'PortAttr', 'GIDEntry', 'AsyncEvent', 'AllocDmAttr', 'DM',
           'get_device_list', 'guid_format', 'raw_to_str']

