"""libibverbs constants, class-qualified (``pyverbs.libibverbs_enums``).

Every C enum is a Python enum class of the same name, iterable, with
libibverbs' numeric values: ``ibv_qp_type.IBV_QPT_RC == 2``.  Each member is
also a module attribute (``IBV_QPT_RC``), and anonymous C enums are plain
module constants, so the old ``pyverbs.enums`` style works from here too.
Bit masks are IntFlag classes, the rest IntEnum.
"""

from enum import IntEnum, IntFlag

__all__ = []


def _export(cls):
    __all__.append(cls.__name__)
    for name, member in cls.__members__.items():
        globals()[name] = member
        __all__.append(name)
    return cls


def _consts(**values):
    for name, value in values.items():
        globals()[name] = value
        __all__.append(name)


@_export
class ibv_transport_type(IntEnum):
    IBV_TRANSPORT_UNKNOWN = -1
    IBV_TRANSPORT_IB = 0
    IBV_TRANSPORT_IWARP = 1
    IBV_TRANSPORT_USNIC = 2
    IBV_TRANSPORT_USNIC_UDP = 3
    IBV_TRANSPORT_UNSPECIFIED = 4


@_export
class ibv_node_type(IntEnum):
    IBV_NODE_UNKNOWN = -1
    IBV_NODE_CA = 1
    IBV_NODE_SWITCH = 2
    IBV_NODE_ROUTER = 3
    IBV_NODE_RNIC = 4
    IBV_NODE_USNIC = 5
    IBV_NODE_USNIC_UDP = 6
    IBV_NODE_UNSPECIFIED = 7


_consts(IBV_LINK_LAYER_UNSPECIFIED=0, IBV_LINK_LAYER_INFINIBAND=1, IBV_LINK_LAYER_ETHERNET=2)


@_export
class ibv_atomic_cap(IntEnum):
    IBV_ATOMIC_NONE = 0
    IBV_ATOMIC_HCA = 1
    IBV_ATOMIC_GLOB = 2


@_export
class ibv_port_state(IntEnum):
    IBV_PORT_NOP = 0
    IBV_PORT_DOWN = 1
    IBV_PORT_INIT = 2
    IBV_PORT_ARMED = 3
    IBV_PORT_ACTIVE = 4
    IBV_PORT_ACTIVE_DEFER = 5


@_export
class ibv_port_cap_flags(IntFlag):
    IBV_PORT_SM = 1 << 1
    IBV_PORT_NOTICE_SUP = 1 << 2
    IBV_PORT_TRAP_SUP = 1 << 3
    IBV_PORT_OPT_IPD_SUP = 1 << 4
    IBV_PORT_AUTO_MIGR_SUP = 1 << 5
    IBV_PORT_SL_MAP_SUP = 1 << 6
    IBV_PORT_MKEY_NVRAM = 1 << 7
    IBV_PORT_PKEY_NVRAM = 1 << 8
    IBV_PORT_LED_INFO_SUP = 1 << 9
    IBV_PORT_SYS_IMAGE_GUID_SUP = 1 << 11
    IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP = 1 << 12
    IBV_PORT_EXTENDED_SPEEDS_SUP = 1 << 14
    IBV_PORT_CAP_MASK2_SUP = 1 << 15
    IBV_PORT_CM_SUP = 1 << 16
    IBV_PORT_SNMP_TUNNEL_SUP = 1 << 17
    IBV_PORT_REINIT_SUP = 1 << 18
    IBV_PORT_DEVICE_MGMT_SUP = 1 << 19
    IBV_PORT_VENDOR_CLASS_SUP = 1 << 20
    IBV_PORT_DR_NOTICE_SUP = 1 << 21
    IBV_PORT_CAP_MASK_NOTICE_SUP = 1 << 22
    IBV_PORT_BOOT_MGMT_SUP = 1 << 23
    IBV_PORT_LINK_LATENCY_SUP = 1 << 24
    IBV_PORT_CLIENT_REG_SUP = 1 << 25
    IBV_PORT_IP_BASED_GIDS = 1 << 26


@_export
class ibv_port_cap_flags2(IntFlag):
    IBV_PORT_SET_NODE_DESC_SUP = 1 << 0
    IBV_PORT_INFO_EXT_SUP = 1 << 1
    IBV_PORT_VIRT_SUP = 1 << 2
    IBV_PORT_SWITCH_PORT_STATE_TABLE_SUP = 1 << 3
    IBV_PORT_LINK_WIDTH_2X_SUP = 1 << 4
    IBV_PORT_LINK_SPEED_HDR_SUP = 1 << 5


@_export
class ibv_mtu(IntEnum):
    IBV_MTU_256 = 1
    IBV_MTU_512 = 2
    IBV_MTU_1024 = 3
    IBV_MTU_2048 = 4
    IBV_MTU_4096 = 5


@_export
class ibv_event_type(IntEnum):
    IBV_EVENT_CQ_ERR = 0
    IBV_EVENT_QP_FATAL = 1
    IBV_EVENT_QP_REQ_ERR = 2
    IBV_EVENT_QP_ACCESS_ERR = 3
    IBV_EVENT_COMM_EST = 4
    IBV_EVENT_SQ_DRAINED = 5
    IBV_EVENT_PATH_MIG = 6
    IBV_EVENT_PATH_MIG_ERR = 7
    IBV_EVENT_DEVICE_FATAL = 8
    IBV_EVENT_PORT_ACTIVE = 9
    IBV_EVENT_PORT_ERR = 10
    IBV_EVENT_LID_CHANGE = 11
    IBV_EVENT_PKEY_CHANGE = 12
    IBV_EVENT_SM_CHANGE = 13
    IBV_EVENT_SRQ_ERR = 14
    IBV_EVENT_SRQ_LIMIT_REACHED = 15
    IBV_EVENT_QP_LAST_WQE_REACHED = 16
    IBV_EVENT_CLIENT_REREGISTER = 17
    IBV_EVENT_GID_CHANGE = 18
    IBV_EVENT_WQ_FATAL = 19


@_export
class ibv_access_flags(IntFlag):
    IBV_ACCESS_LOCAL_WRITE = 1
    IBV_ACCESS_REMOTE_WRITE = 1 << 1
    IBV_ACCESS_REMOTE_READ = 1 << 2
    IBV_ACCESS_REMOTE_ATOMIC = 1 << 3
    IBV_ACCESS_MW_BIND = 1 << 4
    IBV_ACCESS_ZERO_BASED = 1 << 5
    IBV_ACCESS_ON_DEMAND = 1 << 6
    IBV_ACCESS_HUGETLB = 1 << 7
    IBV_ACCESS_FLUSH_GLOBAL = 1 << 8
    IBV_ACCESS_FLUSH_PERSISTENT = 1 << 9
    IBV_ACCESS_RELAXED_ORDERING = 1 << 20


_consts(IBV_ACCESS_OPTIONAL_FIRST=1 << 20)


@_export
class ibv_wr_opcode(IntEnum):
    IBV_WR_RDMA_WRITE = 0
    IBV_WR_RDMA_WRITE_WITH_IMM = 1
    IBV_WR_SEND = 2
    IBV_WR_SEND_WITH_IMM = 3
    IBV_WR_RDMA_READ = 4
    IBV_WR_ATOMIC_CMP_AND_SWP = 5
    IBV_WR_ATOMIC_FETCH_AND_ADD = 6
    IBV_WR_LOCAL_INV = 7
    IBV_WR_BIND_MW = 8
    IBV_WR_SEND_WITH_INV = 9
    IBV_WR_TSO = 10
    IBV_WR_DRIVER1 = 11
    IBV_WR_FLUSH = 14
    IBV_WR_ATOMIC_WRITE = 15


@_export
class ibv_send_flags(IntFlag):
    IBV_SEND_FENCE = 1 << 0
    IBV_SEND_SIGNALED = 1 << 1
    IBV_SEND_SOLICITED = 1 << 2
    IBV_SEND_INLINE = 1 << 3
    IBV_SEND_IP_CSUM = 1 << 4


@_export
class ibv_placement_type(IntFlag):
    IBV_FLUSH_GLOBAL = 1
    IBV_FLUSH_PERSISTENT = 2


@_export
class ibv_selectivity_level(IntEnum):
    IBV_FLUSH_RANGE = 0
    IBV_FLUSH_MR = 1


@_export
class ibv_qp_type(IntEnum):
    IBV_QPT_RC = 2
    IBV_QPT_UC = 3
    IBV_QPT_UD = 4
    IBV_QPT_RAW_PACKET = 8
    IBV_QPT_XRC_SEND = 9
    IBV_QPT_XRC_RECV = 10
    IBV_QPT_DRIVER = 0xFF


@_export
class ibv_qp_state(IntEnum):
    IBV_QPS_RESET = 0
    IBV_QPS_INIT = 1
    IBV_QPS_RTR = 2
    IBV_QPS_RTS = 3
    IBV_QPS_SQD = 4
    IBV_QPS_SQE = 5
    IBV_QPS_ERR = 6
    IBV_QPS_UNKNOWN = 7


@_export
class ibv_mw_type(IntEnum):
    IBV_MW_TYPE_1 = 1
    IBV_MW_TYPE_2 = 2


@_export
class ibv_wc_status(IntEnum):
    IBV_WC_SUCCESS = 0
    IBV_WC_LOC_LEN_ERR = 1
    IBV_WC_LOC_QP_OP_ERR = 2
    IBV_WC_LOC_EEC_OP_ERR = 3
    IBV_WC_LOC_PROT_ERR = 4
    IBV_WC_WR_FLUSH_ERR = 5
    IBV_WC_MW_BIND_ERR = 6
    IBV_WC_BAD_RESP_ERR = 7
    IBV_WC_LOC_ACCESS_ERR = 8
    IBV_WC_REM_INV_REQ_ERR = 9
    IBV_WC_REM_ACCESS_ERR = 10
    IBV_WC_REM_OP_ERR = 11
    IBV_WC_RETRY_EXC_ERR = 12
    IBV_WC_RNR_RETRY_EXC_ERR = 13
    IBV_WC_LOC_RDD_VIOL_ERR = 14
    IBV_WC_REM_INV_RD_REQ_ERR = 15
    IBV_WC_REM_ABORT_ERR = 16
    IBV_WC_INV_EECN_ERR = 17
    IBV_WC_INV_EEC_STATE_ERR = 18
    IBV_WC_FATAL_ERR = 19
    IBV_WC_RESP_TIMEOUT_ERR = 20
    IBV_WC_GENERAL_ERR = 21
    IBV_WC_TM_ERR = 22
    IBV_WC_TM_RNDV_INCOMPLETE = 23


@_export
class ibv_wc_opcode(IntEnum):
    IBV_WC_SEND = 0
    IBV_WC_RDMA_WRITE = 1
    IBV_WC_RDMA_READ = 2
    IBV_WC_COMP_SWAP = 3
    IBV_WC_FETCH_ADD = 4
    IBV_WC_BIND_MW = 5
    IBV_WC_LOCAL_INV = 6
    IBV_WC_TSO = 7
    IBV_WC_FLUSH = 8
    IBV_WC_ATOMIC_WRITE = 9
    IBV_WC_RECV = 1 << 7
    IBV_WC_RECV_RDMA_WITH_IMM = 129
    IBV_WC_TM_ADD = 130
    IBV_WC_TM_DEL = 131
    IBV_WC_TM_SYNC = 132
    IBV_WC_TM_RECV = 133
    IBV_WC_TM_NO_TAG = 134
    IBV_WC_DRIVER1 = 135
    IBV_WC_DRIVER2 = 136
    IBV_WC_DRIVER3 = 137


_consts(IBV_WC_IP_CSUM_OK_SHIFT=2)


@_export
class ibv_create_cq_wc_flags(IntFlag):
    IBV_WC_EX_WITH_BYTE_LEN = 1 << 0
    IBV_WC_EX_WITH_IMM = 1 << 1
    IBV_WC_EX_WITH_QP_NUM = 1 << 2
    IBV_WC_EX_WITH_SRC_QP = 1 << 3
    IBV_WC_EX_WITH_SLID = 1 << 4
    IBV_WC_EX_WITH_SL = 1 << 5
    IBV_WC_EX_WITH_DLID_PATH_BITS = 1 << 6
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP = 1 << 7
    IBV_WC_EX_WITH_CVLAN = 1 << 8
    IBV_WC_EX_WITH_FLOW_TAG = 1 << 9
    IBV_WC_EX_WITH_TM_INFO = 1 << 10
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK = 1 << 11


_consts(IBV_WC_STANDARD_FLAGS=0x7F, IBV_CREATE_CQ_SUP_WC_FLAGS=0xFFF)


@_export
class ibv_wc_flags(IntFlag):
    IBV_WC_GRH = 1 << 0
    IBV_WC_WITH_IMM = 1 << 1
    IBV_WC_IP_CSUM_OK = 1 << 2
    IBV_WC_WITH_INV = 1 << 3
    IBV_WC_TM_SYNC_REQ = 1 << 4
    IBV_WC_TM_MATCH = 1 << 5
    IBV_WC_TM_DATA_VALID = 1 << 6


@_export
class ibv_tm_cap_flags(IntFlag):
    IBV_TM_CAP_RC = 1 << 0


@_export
class ibv_srq_attr_mask(IntFlag):
    IBV_SRQ_MAX_WR = 1 << 0
    IBV_SRQ_LIMIT = 1 << 1


@_export
class ibv_srq_type(IntEnum):
    IBV_SRQT_BASIC = 0
    IBV_SRQT_XRC = 1
    IBV_SRQT_TM = 2


@_export
class ibv_srq_init_attr_mask(IntFlag):
    IBV_SRQ_INIT_ATTR_TYPE = 1 << 0
    IBV_SRQ_INIT_ATTR_PD = 1 << 1
    IBV_SRQ_INIT_ATTR_XRCD = 1 << 2
    IBV_SRQ_INIT_ATTR_CQ = 1 << 3
    IBV_SRQ_INIT_ATTR_TM = 1 << 4
    IBV_SRQ_INIT_ATTR_RESERVED = 1 << 5


@_export
class ibv_mig_state(IntEnum):
    IBV_MIG_MIGRATED = 0
    IBV_MIG_REARM = 1
    IBV_MIG_ARMED = 2


@_export
class ibv_qp_init_attr_mask(IntFlag):
    IBV_QP_INIT_ATTR_PD = 1 << 0
    IBV_QP_INIT_ATTR_XRCD = 1 << 1
    IBV_QP_INIT_ATTR_CREATE_FLAGS = 1 << 2
    IBV_QP_INIT_ATTR_MAX_TSO_HEADER = 1 << 3
    IBV_QP_INIT_ATTR_IND_TABLE = 1 << 4
    IBV_QP_INIT_ATTR_RX_HASH = 1 << 5
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = 1 << 6


@_export
class ibv_qp_create_flags(IntFlag):
    IBV_QP_CREATE_BLOCK_SELF_MCAST_LB = 1 << 1
    IBV_QP_CREATE_SCATTER_FCS = 1 << 8
    IBV_QP_CREATE_CVLAN_STRIPPING = 1 << 9
    IBV_QP_CREATE_SOURCE_QPN = 1 << 10
    IBV_QP_CREATE_PCI_WRITE_END_PADDING = 1 << 11


@_export
class ibv_qp_create_send_ops_flags(IntFlag):
    IBV_QP_EX_WITH_RDMA_WRITE = 1 << 0
    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM = 1 << 1
    IBV_QP_EX_WITH_SEND = 1 << 2
    IBV_QP_EX_WITH_SEND_WITH_IMM = 1 << 3
    IBV_QP_EX_WITH_RDMA_READ = 1 << 4
    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP = 1 << 5
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD = 1 << 6
    IBV_QP_EX_WITH_LOCAL_INV = 1 << 7
    IBV_QP_EX_WITH_BIND_MW = 1 << 8
    IBV_QP_EX_WITH_SEND_WITH_INV = 1 << 9
    IBV_QP_EX_WITH_TSO = 1 << 10
    IBV_QP_EX_WITH_FLUSH = 1 << 11
    IBV_QP_EX_WITH_ATOMIC_WRITE = 1 << 12


@_export
class ibv_qp_open_attr_mask(IntFlag):
    IBV_QP_OPEN_ATTR_NUM = 1 << 0
    IBV_QP_OPEN_ATTR_XRCD = 1 << 1
    IBV_QP_OPEN_ATTR_CONTEXT = 1 << 2
    IBV_QP_OPEN_ATTR_TYPE = 1 << 3
    IBV_QP_OPEN_ATTR_RESERVED = 1 << 4


@_export
class ibv_qp_attr_mask(IntFlag):
    IBV_QP_STATE = 1 << 0
    IBV_QP_CUR_STATE = 1 << 1
    IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 2
    IBV_QP_ACCESS_FLAGS = 1 << 3
    IBV_QP_PKEY_INDEX = 1 << 4
    IBV_QP_PORT = 1 << 5
    IBV_QP_QKEY = 1 << 6
    IBV_QP_AV = 1 << 7
    IBV_QP_PATH_MTU = 1 << 8
    IBV_QP_TIMEOUT = 1 << 9
    IBV_QP_RETRY_CNT = 1 << 10
    IBV_QP_RNR_RETRY = 1 << 11
    IBV_QP_RQ_PSN = 1 << 12
    IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13
    IBV_QP_ALT_PATH = 1 << 14
    IBV_QP_MIN_RNR_TIMER = 1 << 15
    IBV_QP_SQ_PSN = 1 << 16
    IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17
    IBV_QP_PATH_MIG_STATE = 1 << 18
    IBV_QP_CAP = 1 << 19
    IBV_QP_DEST_QPN = 1 << 20
    IBV_QP_RATE_LIMIT = 1 << 25


@_export
class ibv_wq_type(IntEnum):
    IBV_WQT_RQ = 0


@_export
class ibv_wq_init_attr_mask(IntFlag):
    IBV_WQ_INIT_ATTR_FLAGS = 1 << 0
    IBV_WQ_INIT_ATTR_RESERVED = 1 << 1


@_export
class ibv_wq_flags(IntFlag):
    IBV_WQ_FLAGS_CVLAN_STRIPPING = 1 << 0
    IBV_WQ_FLAGS_SCATTER_FCS = 1 << 1
    IBV_WQ_FLAGS_DELAY_DROP = 1 << 2
    IBV_WQ_FLAGS_PCI_WRITE_END_PADDING = 1 << 3
    IBV_WQ_FLAGS_RESERVED = 1 << 4


@_export
class ibv_wq_state(IntEnum):
    IBV_WQS_RESET = 0
    IBV_WQS_RDY = 1
    IBV_WQS_ERR = 2
    IBV_WQS_UNKNOWN = 3


@_export
class ibv_wq_attr_mask(IntFlag):
    IBV_WQ_ATTR_STATE = 1 << 0
    IBV_WQ_ATTR_CURR_STATE = 1 << 1
    IBV_WQ_ATTR_FLAGS = 1 << 2
    IBV_WQ_ATTR_RESERVED = 1 << 3


@_export
class ibv_ind_table_init_attr_mask(IntFlag):
    IBV_CREATE_IND_TABLE_RESERVED = 1 << 0


@_export
class ibv_rx_hash_function_flags(IntFlag):
    IBV_RX_HASH_FUNC_TOEPLITZ = 1 << 0


@_export
class ibv_rx_hash_fields(IntFlag):
    IBV_RX_HASH_SRC_IPV4 = 1 << 0
    IBV_RX_HASH_DST_IPV4 = 1 << 1
    IBV_RX_HASH_SRC_IPV6 = 1 << 2
    IBV_RX_HASH_DST_IPV6 = 1 << 3
    IBV_RX_HASH_SRC_PORT_TCP = 1 << 4
    IBV_RX_HASH_DST_PORT_TCP = 1 << 5
    IBV_RX_HASH_SRC_PORT_UDP = 1 << 6
    IBV_RX_HASH_DST_PORT_UDP = 1 << 7
    IBV_RX_HASH_IPSEC_SPI = 1 << 8
    IBV_RX_HASH_INNER = 1 << 31


@_export
class ibv_ops_wr_opcode(IntEnum):
    IBV_WR_TAG_ADD = 0
    IBV_WR_TAG_DEL = 1
    IBV_WR_TAG_SYNC = 2


@_export
class ibv_ops_flags(IntFlag):
    IBV_OPS_SIGNALED = 1 << 0
    IBV_OPS_TM_SYNC = 1 << 1


@_export
class ibv_flow_flags(IntFlag):
    IBV_FLOW_ATTR_FLAGS_ALLOW_LOOP_BACK = 1 << 0
    IBV_FLOW_ATTR_FLAGS_DONT_TRAP = 1 << 1
    IBV_FLOW_ATTR_FLAGS_EGRESS = 1 << 2


@_export
class ibv_flow_attr_type(IntEnum):
    IBV_FLOW_ATTR_NORMAL = 0x0
    IBV_FLOW_ATTR_ALL_DEFAULT = 0x1
    IBV_FLOW_ATTR_MC_DEFAULT = 0x2
    IBV_FLOW_ATTR_SNIFFER = 0x3


@_export
class ibv_flow_spec_type(IntEnum):
    IBV_FLOW_SPEC_ETH = 0x20
    IBV_FLOW_SPEC_IPV4 = 0x30
    IBV_FLOW_SPEC_IPV6 = 0x31
    IBV_FLOW_SPEC_IPV4_EXT = 0x32
    IBV_FLOW_SPEC_ESP = 0x34
    IBV_FLOW_SPEC_TCP = 0x40
    IBV_FLOW_SPEC_UDP = 0x41
    IBV_FLOW_SPEC_VXLAN_TUNNEL = 0x50
    IBV_FLOW_SPEC_GRE = 0x51
    IBV_FLOW_SPEC_MPLS = 0x60
    IBV_FLOW_SPEC_INNER = 0x100
    IBV_FLOW_SPEC_ACTION_TAG = 0x1000
    IBV_FLOW_SPEC_ACTION_DROP = 0x1001
    IBV_FLOW_SPEC_ACTION_HANDLE = 0x1002
    IBV_FLOW_SPEC_ACTION_COUNT = 0x1003


_consts(IBV_QPF_GRH_REQUIRED=1 << 0)


@_export
class ibv_counter_description(IntEnum):
    IBV_COUNTER_PACKETS = 0
    IBV_COUNTER_BYTES = 1


@_export
class ibv_read_counters_flags(IntFlag):
    IBV_READ_COUNTERS_ATTR_PREFER_CACHED = 1 << 0


@_export
class ibv_cq_init_attr_mask(IntFlag):
    IBV_CQ_INIT_ATTR_MASK_FLAGS = 1 << 0
    IBV_CQ_INIT_ATTR_MASK_PD = 1 << 1


@_export
class ibv_create_cq_attr_flags(IntFlag):
    IBV_CREATE_CQ_ATTR_SINGLE_THREADED = 1 << 0
    IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN = 1 << 1


@_export
class ibv_cq_attr_mask(IntFlag):
    IBV_CQ_ATTR_MODERATE = 1 << 0
    IBV_CQ_ATTR_RESERVED = 1 << 1


@_export
class ibv_odp_general_caps(IntFlag):
    IBV_ODP_SUPPORT = 1 << 0
    IBV_ODP_SUPPORT_IMPLICIT = 1 << 1


@_export
class ibv_odp_transport_cap_bits(IntFlag):
    IBV_ODP_SUPPORT_SEND = 1 << 0
    IBV_ODP_SUPPORT_RECV = 1 << 1
    IBV_ODP_SUPPORT_WRITE = 1 << 2
    IBV_ODP_SUPPORT_READ = 1 << 3
    IBV_ODP_SUPPORT_ATOMIC = 1 << 4
    IBV_ODP_SUPPORT_SRQ_RECV = 1 << 5
    IBV_ODP_SUPPORT_FLUSH = 1 << 6                  # rdma-core 64
    IBV_ODP_SUPPORT_ATOMIC_WRITE = 1 << 7


@_export
class ibv_device_cap_flags(IntFlag):
    IBV_DEVICE_RESIZE_MAX_WR = 1 << 0
    IBV_DEVICE_BAD_PKEY_CNTR = 1 << 1
    IBV_DEVICE_BAD_QKEY_CNTR = 1 << 2
    IBV_DEVICE_RAW_MULTI = 1 << 3
    IBV_DEVICE_AUTO_PATH_MIG = 1 << 4
    IBV_DEVICE_CHANGE_PHY_PORT = 1 << 5
    IBV_DEVICE_UD_AV_PORT_ENFORCE = 1 << 6
    IBV_DEVICE_CURR_QP_STATE_MOD = 1 << 7
    IBV_DEVICE_SHUTDOWN_PORT = 1 << 8
    IBV_DEVICE_INIT_TYPE = 1 << 9
    IBV_DEVICE_PORT_ACTIVE_EVENT = 1 << 10
    IBV_DEVICE_SYS_IMAGE_GUID = 1 << 11
    IBV_DEVICE_RC_RNR_NAK_GEN = 1 << 12
    IBV_DEVICE_SRQ_RESIZE = 1 << 13
    IBV_DEVICE_N_NOTIFY_CQ = 1 << 14
    IBV_DEVICE_MEM_WINDOW = 1 << 17
    IBV_DEVICE_UD_IP_CSUM = 1 << 18
    IBV_DEVICE_XRC = 1 << 20
    IBV_DEVICE_MEM_MGT_EXTENSIONS = 1 << 21
    IBV_DEVICE_MEM_WINDOW_TYPE_2A = 1 << 23
    IBV_DEVICE_MEM_WINDOW_TYPE_2B = 1 << 24
    IBV_DEVICE_RC_IP_CSUM = 1 << 25
    IBV_DEVICE_RAW_IP_CSUM = 1 << 26
    IBV_DEVICE_MANAGED_FLOW_STEERING = 1 << 29


@_export
class ibv_raw_packet_caps(IntFlag):
    IBV_RAW_PACKET_CAP_CVLAN_STRIPPING = 1 << 0
    IBV_RAW_PACKET_CAP_SCATTER_FCS = 1 << 1
    IBV_RAW_PACKET_CAP_IP_CSUM = 1 << 2
    IBV_RAW_PACKET_CAP_DELAY_DROP = 1 << 3


@_export
class ibv_pci_atomic_op_size(IntFlag):
    IBV_PCI_ATOMIC_OPERATION_4_BYTE_SIZE_SUP = 1 << 0
    IBV_PCI_ATOMIC_OPERATION_8_BYTE_SIZE_SUP = 1 << 1
    IBV_PCI_ATOMIC_OPERATION_16_BYTE_SIZE_SUP = 1 << 2


@_export
class ibv_xrcd_init_attr_mask(IntFlag):
    IBV_XRCD_INIT_ATTR_FD = 1 << 0
    IBV_XRCD_INIT_ATTR_OFLAGS = 1 << 1
    IBV_XRCD_INIT_ATTR_RESERVED = 1 << 2


@_export
class ibv_rereg_mr_flags(IntFlag):
    IBV_REREG_MR_CHANGE_TRANSLATION = 1 << 0
    IBV_REREG_MR_CHANGE_PD = 1 << 1
    IBV_REREG_MR_CHANGE_ACCESS = 1 << 2
    IBV_REREG_MR_KEEP_VALID = 1 << 3
    IBV_REREG_MR_FLAGS_SUPPORTED = (1 << 4) - 1


@_export
class ibv_rereg_mr_err_code(IntEnum):
    IBV_REREG_MR_ERR_INPUT = -1
    IBV_REREG_MR_ERR_DONT_FORK_NEW = -2
    IBV_REREG_MR_ERR_DO_FORK_OLD = -3
    IBV_REREG_MR_ERR_CMD = -4
    IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW = -5


@_export
class ibv_rate(IntEnum):
    IBV_RATE_MAX = 0
    IBV_RATE_2_5_GBPS = 2
    IBV_RATE_5_GBPS = 5
    IBV_RATE_10_GBPS = 3
    IBV_RATE_20_GBPS = 6
    IBV_RATE_30_GBPS = 4
    IBV_RATE_40_GBPS = 7
    IBV_RATE_60_GBPS = 8
    IBV_RATE_80_GBPS = 9
    IBV_RATE_120_GBPS = 10
    IBV_RATE_14_GBPS = 11
    IBV_RATE_56_GBPS = 12
    IBV_RATE_112_GBPS = 13
    IBV_RATE_168_GBPS = 14
    IBV_RATE_25_GBPS = 15
    IBV_RATE_100_GBPS = 16
    IBV_RATE_200_GBPS = 17
    IBV_RATE_300_GBPS = 18
    IBV_RATE_28_GBPS = 19
    IBV_RATE_50_GBPS = 20
    IBV_RATE_400_GBPS = 21
    IBV_RATE_600_GBPS = 22


@_export
class ibv_gid_type(IntEnum):
    IBV_GID_TYPE_IB = 0
    IBV_GID_TYPE_ROCE_V1 = 1
    IBV_GID_TYPE_ROCE_V2 = 2


@_export
class ibv_gid_type_sysfs(IntEnum):
    IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = 0
    IBV_GID_TYPE_SYSFS_ROCE_V2 = 1


@_export
class ibv_values_mask(IntFlag):
    IBV_VALUES_MASK_RAW_CLOCK = 1 << 0
    IBV_VALUES_MASK_RESERVED = 1 << 1


@_export
class ibv_parent_domain_init_attr_mask(IntFlag):
    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS = 1 << 0
    IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT = 1 << 1
    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOW_CC_UNPROTECTED_ALLOC = 1 << 2     # rdma-core 64


@_export
class ibv_advise_mr_advice(IntEnum):
    IBV_ADVISE_MR_ADVICE_PREFETCH = 0
    IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE = 1
    IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT = 2


@_export
class ibv_fork_status(IntEnum):
    IBV_FORK_DISABLED = 0
    IBV_FORK_ENABLED = 1
    IBV_FORK_UNNEEDED = 2


@_export
class ibv_tmh_op(IntEnum):
    IBV_TMH_NO_TAG = 0
    IBV_TMH_RNDV = 1
    IBV_TMH_FIN = 2
    IBV_TMH_EAGER = 3


# Later rdma-core's (64's verbs.h): extended MR registration, DMA handles, data-in-order
# queries; softnic offers none of their verbs, so nothing here is acted on.
@_export
class ibv_mr_init_attr_mask(IntFlag):
    IBV_REG_MR_MASK_IOVA = 1 << 0
    IBV_REG_MR_MASK_ADDR = 1 << 1
    IBV_REG_MR_MASK_FD = 1 << 2
    IBV_REG_MR_MASK_FD_OFFSET = 1 << 3
    IBV_REG_MR_MASK_DMAH = 1 << 4
    IBV_REG_MR_MASK_BUF = 1 << 5


@_export
class ibv_query_qp_data_in_order_flags(IntFlag):
    IBV_QUERY_QP_DATA_IN_ORDER_RETURN_CAPS = 1 << 0
    IBV_QUERY_QP_DATA_IN_ORDER_DEVICE_ONLY = 1 << 1


@_export
class ibv_query_qp_data_in_order_caps(IntFlag):
    IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG = 1 << 0
    IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES = 1 << 1


@_export
class ibv_tph_mem_type(IntEnum):
    IBV_TPH_MEM_TYPE_VM = 0
    IBV_TPH_MEM_TYPE_PM = 1


@_export
class ibv_dmah_init_attr_mask(IntFlag):
    IBV_DMAH_INIT_ATTR_MASK_CPU_ID = 1 << 0
    IBV_DMAH_INIT_ATTR_MASK_PH = 1 << 1
    IBV_DMAH_INIT_ATTR_MASK_TPH_MEM_TYPE = 1 << 2


# Values that are #defines (or wider than a C enum) in verbs.h; pyverbs
# exposes them with a leading underscore.
_consts(
    IBV_ADVISE_MR_FLAG_FLUSH=1 << 0,
    _IBV_DEVICE_RAW_SCATTER_FCS=1 << 34,
    _IBV_DEVICE_PCI_WRITE_END_PADDING=1 << 36,
    _IBV_DEVICE_CC_DMA_BOUNCE=1 << 41,
    _IBV_ALLOCATOR_USE_DEFAULT=(1 << 64) - 1,
    _IBV_ADVISE_MR_ADVICE_PREFETCH=0,
    _IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE=1,
    _IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT=2,
    _IBV_ADVISE_MR_FLAG_FLUSH=1 << 0,
)
