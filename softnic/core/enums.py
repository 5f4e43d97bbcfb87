"""Verbs constants, with libibverbs' numeric values so an API layer maps 1:1."""

from enum import IntEnum, IntFlag


class QPType(IntEnum):
    RC = 2
    UC = 3
    UD = 4


class QPState(IntEnum):
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6


class QPAttrMask(IntFlag):
    STATE = 1 << 0
    CUR_STATE = 1 << 1
    EN_SQD_ASYNC_NOTIFY = 1 << 2
    ACCESS_FLAGS = 1 << 3
    PKEY_INDEX = 1 << 4
    PORT = 1 << 5
    QKEY = 1 << 6
    AV = 1 << 7
    PATH_MTU = 1 << 8
    TIMEOUT = 1 << 9
    RETRY_CNT = 1 << 10
    RNR_RETRY = 1 << 11
    RQ_PSN = 1 << 12
    MAX_QP_RD_ATOMIC = 1 << 13
    ALT_PATH = 1 << 14
    MIN_RNR_TIMER = 1 << 15
    SQ_PSN = 1 << 16
    MAX_DEST_RD_ATOMIC = 1 << 17
    PATH_MIG_STATE = 1 << 18
    CAP = 1 << 19
    DEST_QPN = 1 << 20


class Access(IntFlag):
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8
    MW_BIND = 16
    ZERO_BASED = 32
    ON_DEMAND = 64
    FLUSH_GLOBAL = 1 << 8       # a FLUSH may make placed data globally visible
    FLUSH_PERSISTENT = 1 << 9   # ... or persistent (memory that can be: rxe, pmem only)


class WROpcode(IntEnum):
    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6
    LOCAL_INV = 7
    BIND_MW = 8
    SEND_WITH_INV = 9
    FLUSH = 14                # placed data made visible/persistent (rxe since Linux 6.2)
    ATOMIC_WRITE = 15         # 8 bytes written as one (IBTA 1.5, rxe since Linux 6.2)


class SendFlags(IntFlag):
    FENCE = 1
    SIGNALED = 2
    SOLICITED = 4
    INLINE = 8


class WCStatus(IntEnum):
    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


class WCOpcode(IntEnum):
    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    BIND_MW = 5
    LOCAL_INV = 6
    FLUSH = 8
    ATOMIC_WRITE = 9
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


class WCFlags(IntFlag):
    GRH = 1
    WITH_IMM = 2
    IP_CSUM_OK = 4
    WITH_INV = 8


class EventType(IntEnum):
    CQ_ERR = 0
    QP_FATAL = 1
    QP_REQ_ERR = 2
    QP_ACCESS_ERR = 3
    COMM_EST = 4
    SQ_DRAINED = 5
    SRQ_ERR = 14
    SRQ_LIMIT_REACHED = 15
    QP_LAST_WQE_REACHED = 16


class MTU(IntEnum):
    """ibv_mtu enum values."""
    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5


def mtu_bytes(mtu: int) -> int:
    """ibv_mtu enum (1..5) -> bytes.  Also accepts a byte count 256..4096."""
    if 1 <= mtu <= 5:
        return 128 << mtu
    if mtu in (256, 512, 1024, 2048, 4096):
        return mtu
    raise ValueError(f"invalid path MTU {mtu}")


# IBA table "Encoding for RNR NAK Timer Field": code -> seconds.
RNR_TIMER_SECONDS = (
    655.36e-3, 0.01e-3, 0.02e-3, 0.03e-3, 0.04e-3, 0.06e-3, 0.08e-3, 0.12e-3,
    0.16e-3, 0.24e-3, 0.32e-3, 0.48e-3, 0.64e-3, 0.96e-3, 1.28e-3, 1.92e-3,
    2.56e-3, 3.84e-3, 5.12e-3, 7.68e-3, 10.24e-3, 15.36e-3, 20.48e-3, 30.72e-3,
    40.96e-3, 61.44e-3, 81.92e-3, 122.88e-3, 163.84e-3, 245.76e-3, 327.68e-3, 491.52e-3,
)
