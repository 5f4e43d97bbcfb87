"""``pyverbs.cm_enums``: librdmacm's enums, with the names and values pyverbs has."""

from enum import IntEnum


class rdma_cm_event_type(IntEnum):
    RDMA_CM_EVENT_ADDR_RESOLVED = 0
    RDMA_CM_EVENT_ADDR_ERROR = 1
    RDMA_CM_EVENT_ROUTE_RESOLVED = 2
    RDMA_CM_EVENT_ROUTE_ERROR = 3
    RDMA_CM_EVENT_CONNECT_REQUEST = 4
    RDMA_CM_EVENT_CONNECT_RESPONSE = 5
    RDMA_CM_EVENT_CONNECT_ERROR = 6
    RDMA_CM_EVENT_UNREACHABLE = 7
    RDMA_CM_EVENT_REJECTED = 8
    RDMA_CM_EVENT_ESTABLISHED = 9
    RDMA_CM_EVENT_DISCONNECTED = 10
    RDMA_CM_EVENT_DEVICE_REMOVAL = 11
    RDMA_CM_EVENT_MULTICAST_JOIN = 12
    RDMA_CM_EVENT_MULTICAST_ERROR = 13
    RDMA_CM_EVENT_ADDR_CHANGE = 14
    RDMA_CM_EVENT_TIMEWAIT_EXIT = 15
    RDMA_CM_EVENT_ADDRINFO_RESOLVED = 16            # rdma-core 64 (rdma_resolve_addrinfo)
    RDMA_CM_EVENT_ADDRINFO_ERROR = 17


class rdma_port_space(IntEnum):
    RDMA_PS_IPOIB = 0x0002
    RDMA_PS_TCP = 0x0106
    RDMA_PS_UDP = 0x0111
    RDMA_PS_IB = 0x013F


class rdma_cm_join_mc_attr_mask(IntEnum):
    RDMA_CM_JOIN_MC_ATTR_ADDRESS = 1
    RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS = 2


class rdma_cm_mc_join_flags(IntEnum):
    RDMA_MC_JOIN_FLAG_FULLMEMBER = 0
    RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER = 1


RAI_PASSIVE = 1
RAI_NUMERICHOST = 2
RAI_NOROUTE = 4
RAI_FAMILY = 8
RDMA_OPTION_ID = 0
RDMA_OPTION_ID_ACK_TIMEOUT = 3

for _cls in (rdma_cm_event_type, rdma_port_space, rdma_cm_join_mc_attr_mask,
             rdma_cm_mc_join_flags):
    globals().update(_cls.__members__)
del _cls
