"""EFA direct-verbs constants (``pyverbs.providers.efa.efa_enums``): rdma-core v44's values, so code that
imports them loads; softnic has no such device, so nothing here is acted on."""

from enum import IntEnum


EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID = 4
EFADV_DEVICE_ATTR_CAPS_RDMA_READ = 1
EFADV_QP_DRIVER_TYPE_SRD = 0
EFADV_WC_EX_WITH_SGID = 1
