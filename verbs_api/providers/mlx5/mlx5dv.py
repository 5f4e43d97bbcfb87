"""``pyverbs.providers.mlx5.mlx5dv``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: ``Mlx5Context`` refuses as pyverbs does on another vendor's
device (``PyverbsUserError``), the other objects and the static methods as mlx5dv refuses
on another vendor's context (EOPNOTSUPP); the attribute classes hold what they are given,
and the functions that name capability bits answer as pyverbs' do (they read no device)."""

from __future__ import annotations

from ... import libibverbs_enums as e
from ...base import PyverbsObject
from ...pyverbs_error import PyverbsUserError
from .. import refuse
from . import mlx5_enums as dve


class Mlx5DVPortAttr(PyverbsObject):
    def __init__(self):
        super().__init__()


class Mlx5DVContextAttr(PyverbsObject):
    def __init__(self, flags=0, comp_mask=0, fds=None):
        super().__init__()
        self.flags = flags
        self.comp_mask = comp_mask
        self.fds = fds


class Mlx5DevxObj(PyverbsObject):
    def __init__(self, context, in_, outlen):
        refuse('Mlx5DevxObj', 'MLX5')

    @staticmethod
    def get_export_size():
        refuse('Mlx5DevxObj.get_export_size', 'MLX5')

    @staticmethod
    def import_obj(context, data):
        refuse('Mlx5DevxObj.import_obj', 'MLX5')


class Mlx5Context(PyverbsObject):
    def __init__(self, attr, name=''):
        raise PyverbsUserError('This is not an MLX5 device')

    @staticmethod
    def query_mlx5_port(ctx, port_num):
        refuse('Mlx5Context.query_mlx5_port', 'MLX5')

    @staticmethod
    def reserved_qpn_alloc(ctx):
        refuse('Mlx5Context.reserved_qpn_alloc', 'MLX5')

    @staticmethod
    def reserved_qpn_dealloc(ctx, qpn):
        refuse('Mlx5Context.reserved_qpn_dealloc', 'MLX5')

    @staticmethod
    def crypto_login(ctx, login_attr):
        refuse('Mlx5Context.crypto_login', 'MLX5')

    @staticmethod
    def query_login_state(ctx):
        refuse('Mlx5Context.query_login_state', 'MLX5')

    @staticmethod
    def crypto_logout(ctx):
        refuse('Mlx5Context.crypto_logout', 'MLX5')

    @staticmethod
    def device_timestamp_to_ns(ctx, device_timestamp):
        refuse('Mlx5Context.device_timestamp_to_ns', 'MLX5')


class Mlx5DVContext(PyverbsObject):
    def __init__(self):
        super().__init__()


class Mlx5DCIStreamInitAttr(PyverbsObject):
    def __init__(self, log_num_concurent=0, log_num_errored=0):
        super().__init__()
        self.log_num_concurent = log_num_concurent
        self.log_num_errored = log_num_errored


class Mlx5DVDCInitAttr(PyverbsObject):
    def __init__(self, dc_type=dve.MLX5DV_DCTYPE_DCI, dct_access_key=0, dci_streams=None):
        super().__init__()
        self.dc_type = dc_type
        self.dct_access_key = dct_access_key
        self.dci_streams = dci_streams


class Mlx5DVQPInitAttr(PyverbsObject):
    def __init__(self, comp_mask=0, create_flags=0, dc_init_attr=None, send_ops_flags=0):
        super().__init__()
        self.comp_mask = comp_mask
        self.create_flags = create_flags
        self.dc_init_attr = dc_init_attr
        self.send_ops_flags = send_ops_flags


class Mlx5QP(PyverbsObject):
    def __init__(self, context, init_attr, dv_init_attr):
        refuse('Mlx5QP', 'MLX5')

    @staticmethod
    def query_lag_port(qp):
        refuse('Mlx5QP.query_lag_port', 'MLX5')

    @staticmethod
    def modify_lag_port(qp, port_num):
        refuse('Mlx5QP.modify_lag_port', 'MLX5')

    @staticmethod
    def modify_qp_sched_elem(qp, req_sched_leaf=None, resp_sched_leaf=None):
        refuse('Mlx5QP.modify_qp_sched_elem', 'MLX5')

    @staticmethod
    def modify_udp_sport(qp, udp_sport):
        refuse('Mlx5QP.modify_udp_sport', 'MLX5')

    @staticmethod
    def map_ah_to_qp(ah, qp_num):
        refuse('Mlx5QP.map_ah_to_qp', 'MLX5')

    @staticmethod
    def modify_dci_stream_channel_id(qp, stream_id):
        refuse('Mlx5QP.modify_dci_stream_channel_id', 'MLX5')


class Mlx5DVCQInitAttr(PyverbsObject):
    def __init__(self, comp_mask=0, cqe_comp_res_format=0, flags=0, cqe_size=0):
        super().__init__()
        self.comp_mask = comp_mask
        self.cqe_comp_res_format = cqe_comp_res_format
        self.flags = flags
        self.cqe_size = cqe_size


class Mlx5CQ(PyverbsObject):
    def __init__(self, context, init_attr, dv_init_attr):
        refuse('Mlx5CQ', 'MLX5')


class Mlx5VAR(PyverbsObject):
    def __init__(self, context, flags=0):
        refuse('Mlx5VAR', 'MLX5')

    @staticmethod
    def get_export_size():
        refuse('Mlx5VAR.get_export_size', 'MLX5')

    @staticmethod
    def import_var(context, data):
        refuse('Mlx5VAR.import_var', 'MLX5')


class Mlx5PP(PyverbsObject):
    def __init__(self, context, pp_context, flags=0):
        refuse('Mlx5PP', 'MLX5')


class Mlx5UAR(PyverbsObject):
    def __init__(self, context, flags=0):
        refuse('Mlx5UAR', 'MLX5')


class Mlx5DmOpAddr(PyverbsObject):
    def __init__(self, dm, op=0):
        refuse('Mlx5DmOpAddr', 'MLX5')


class WqeSeg(PyverbsObject):
    def __init__(self):
        super().__init__()

    @staticmethod
    def sizeof():
        refuse('WqeSeg.sizeof', 'MLX5')


class WqeCtrlSeg(PyverbsObject):
    def __init__(self, pi=0, opcode=0, opmod=0, qp_num=0, fm_ce_se=0, ds=0, signature=0, imm=0):
        super().__init__()
        self.pi = pi
        self.opcode = opcode
        self.opmod = opmod
        self.qp_num = qp_num
        self.fm_ce_se = fm_ce_se
        self.ds = ds
        self.signature = signature
        self.imm = imm

    @staticmethod
    def sizeof():
        refuse('WqeCtrlSeg.sizeof', 'MLX5')


class WqeDataSeg(PyverbsObject):
    def __init__(self, length=0, lkey=0, addr=0):
        super().__init__()
        self.length = length
        self.lkey = lkey
        self.addr = addr

    @staticmethod
    def sizeof():
        refuse('WqeDataSeg.sizeof', 'MLX5')


class Wqe(PyverbsObject):
    def __init__(self, segments, addr=0):
        super().__init__()
        self.segments = segments
        self.addr = addr


class Mlx5UMEM(PyverbsObject):
    def __init__(self, context, size, addr=None, alignment=64, access=0, pgsz_bitmap=0,
                 comp_mask=0, dmabuf_fd=0):
        refuse('Mlx5UMEM', 'MLX5')

    @staticmethod
    def import_umem(context, data):
        refuse('Mlx5UMEM.import_umem', 'MLX5')

    @staticmethod
    def get_export_size():
        refuse('Mlx5UMEM.get_export_size', 'MLX5')


class Mlx5Cqe64(PyverbsObject):
    def __init__(self, addr):
        super().__init__()
        self.addr = addr


class Mlx5DevxMsiVector(PyverbsObject):
    def __init__(self, context):
        refuse('Mlx5DevxMsiVector', 'MLX5')


class Mlx5DevxEq(PyverbsObject):
    def __init__(self, context, in_, outlen):
        refuse('Mlx5DevxEq', 'MLX5')


class Mlx5DevxCmdComp(PyverbsObject):
    def __init__(self, context):
        refuse('Mlx5DevxCmdComp', 'MLX5')


def bitmask_to_str(bits, values):
    """The names of the bits of ``bits`` that ``values`` (bit -> name) knows, in its
    order, comma-separated, then the number: ``'CQE v1, Enhanced ... (9)'``."""
    names = [name for bit, name in values.items() if bit & bits]
    return ', '.join(names) + f' ({bits})'


def qpts_to_str(qp_types):
    """The QP types of a mask with bit ``1 << type`` per type."""
    names = {e.IBV_QPT_RC: 'RC', e.IBV_QPT_UC: 'UC', e.IBV_QPT_UD: 'UD',
             e.IBV_QPT_RAW_PACKET: 'Raw Packet', e.IBV_QPT_XRC_SEND: 'XRC Send',
             e.IBV_QPT_XRC_RECV: 'XRC Recv', e.IBV_QPT_DRIVER: 'Driver QPT'}
    return bitmask_to_str(qp_types, {1 << t: n for t, n in names.items()})


def context_comp_mask_to_str(mask):
    return bitmask_to_str(mask, {
        dve.MLX5DV_CONTEXT_MASK_CQE_COMPRESION: 'CQE compression',
        dve.MLX5DV_CONTEXT_MASK_SWP: 'SW parsing',
        dve.MLX5DV_CONTEXT_MASK_STRIDING_RQ: 'Striding RQ',
        dve.MLX5DV_CONTEXT_MASK_TUNNEL_OFFLOADS: 'Tunnel offloads',
        dve.MLX5DV_CONTEXT_MASK_DYN_BFREGS: 'Dynamic BF regs',
        dve.MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE: 'Clock info update',
        dve.MLX5DV_CONTEXT_MASK_FLOW_ACTION_FLAGS: 'Flow action flags'})


def context_flags_to_str(flags):
    return bitmask_to_str(flags, {
        dve.MLX5DV_CONTEXT_FLAGS_CQE_V1: 'CQE v1',
        dve.MLX5DV_CONTEXT_FLAGS_MPW_ALLOWED: 'Multi packet WQE allowed',
        dve.MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW: 'Enhanced multi packet WQE',
        dve.MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP: 'Support CQE 128B compression',
        dve.MLX5DV_CONTEXT_FLAGS_CQE_128B_PAD: 'Support CQE 128B padding',
        dve.MLX5DV_CONTEXT_FLAGS_PACKET_BASED_CREDIT_MODE:
            'Support packet based credit mode (in RC QP)'})


def swp_to_str(swps):
    return bitmask_to_str(swps, {dve.MLX5DV_SW_PARSING: 'SW Parsing',
                                 dve.MLX5DV_SW_PARSING_CSUM: 'SW Parsing CSUM',
                                 dve.MLX5DV_SW_PARSING_LSO: 'SW Parsing LSO'})


def cqe_comp_to_str(cqe):
    return bitmask_to_str(cqe, {dve.MLX5DV_CQE_RES_FORMAT_HASH: 'with hash',
                                dve.MLX5DV_CQE_RES_FORMAT_CSUM: 'with RX checksum CSUM',
                                dve.MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX: 'with stride index'})


def tunnel_offloads_to_str(tun):
    return bitmask_to_str(tun, {
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_VXLAN: 'VXLAN',
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_GRE: 'GRE',
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_GENEVE: 'Geneve',
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_CW_MPLS_OVER_GRE:
            'Ctrl word + MPLS over GRE',
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_CW_MPLS_OVER_UDP:
            'Ctrl word + MPLS over UDP'})


def dc_type_to_str(dctype):
    return {dve.MLX5DV_DCTYPE_DCT: 'DCT', dve.MLX5DV_DCTYPE_DCI: 'DCI'}.get(
        dctype, f'Unknown DC type ({dctype})')


def qp_comp_mask_to_str(flags):
    return bitmask_to_str(flags, {
        dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS: 'Create flags',
        dve.MLX5DV_QP_INIT_ATTR_MASK_DC: 'DC',
        dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS: 'Send ops flags',
        dve.MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS: 'DCI Stream'})


def qp_create_flags_to_str(flags):
    return bitmask_to_str(flags, {
        dve.MLX5DV_QP_CREATE_TUNNEL_OFFLOADS: 'Tunnel offloads',
        dve.MLX5DV_QP_CREATE_TIR_ALLOW_SELF_LOOPBACK_UC: 'Allow UC self loopback',
        dve.MLX5DV_QP_CREATE_TIR_ALLOW_SELF_LOOPBACK_MC: 'Allow MC self loopback',
        dve.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: 'Disable scatter to CQE',
        dve.MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE: 'Allow scatter to CQE',
        dve.MLX5DV_QP_CREATE_PACKET_BASED_CREDIT_MODE: 'Packet based credit mode',
        dve.MLX5DV_QP_CREATE_SIG_PIPELINING: 'Support signature pipeline support'})


def send_ops_flags_to_str(flags):
    return bitmask_to_str(flags, {
        dve.MLX5DV_QP_EX_WITH_MR_INTERLEAVED: 'With MR interleaved',
        dve.MLX5DV_QP_EX_WITH_MR_LIST: 'With MR list',
        dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE: 'With Mkey configure'})


__all__ = ['Mlx5DVPortAttr',
           'Mlx5DVContextAttr',
           'Mlx5DevxObj',
           'Mlx5Context',
           'Mlx5DVContext',
           'Mlx5DCIStreamInitAttr',
           'Mlx5DVDCInitAttr',
           'Mlx5DVQPInitAttr',
           'Mlx5QP',
           'Mlx5DVCQInitAttr',
           'Mlx5CQ',
           'Mlx5VAR',
           'Mlx5PP',
           'Mlx5UAR',
           'Mlx5DmOpAddr',
           'WqeSeg',
           'WqeCtrlSeg',
           'WqeDataSeg',
           'Wqe',
           'Mlx5UMEM',
           'Mlx5Cqe64',
           'Mlx5DevxMsiVector',
           'Mlx5DevxEq',
           'Mlx5DevxCmdComp',
           'bitmask_to_str',
           'qpts_to_str',
           'context_comp_mask_to_str',
           'context_flags_to_str',
           'swp_to_str',
           'cqe_comp_to_str',
           'tunnel_offloads_to_str',
           'dc_type_to_str',
           'qp_comp_mask_to_str',
           'qp_create_flags_to_str',
           'send_ops_flags_to_str']
