"""``pyverbs.librdmacm_enums``: librdmacm's enums under the module name later pyverbs gives
them (rdma-core 64's tests import this one; 44's import ``pyverbs.cm_enums``): the same
classes and constants as ``verbs_api.cm_enums``."""

from .cm_enums import *  # noqa: F401,F403 -- the one home of these values
from .cm_enums import (RAI_FAMILY, RAI_NOROUTE, RAI_NUMERICHOST, RAI_PASSIVE,  # noqa: F401
                       RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, rdma_cm_event_type,
                       rdma_cm_join_mc_attr_mask, rdma_cm_mc_join_flags, rdma_port_space)
