"""EFA direct-verbs constants (``pyverbs.providers.efa.efa_enums``): rdma-core v44's values, so code that
imports them loads; softnic has no such device, so nothing here is acted on."""

from enum import IntEnum


EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID = 4
EFADV_DEVICE_ATTR_CAPS_RDMA_READ = 1
EFADV_QP_DRIVER_TYPE_SRD = 0
EFADV_WC_EX_WITH_SGID = 1

# rdma-core 64's additions (efadv.h)
EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV = 16
EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV = 1
EFADV_WC_EX_WITH_IS_UNSOLICITED = 2
EFADV_MR_ATTR_VALIDITY_RECV_IC_ID = 1
EFADV_MR_ATTR_VALIDITY_RDMA_READ_IC_ID = 2
EFADV_MR_ATTR_VALIDITY_RDMA_RECV_IC_ID = 4
