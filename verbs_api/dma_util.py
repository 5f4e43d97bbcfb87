"""``pyverbs.dma_util``: memory barriers and MMIO writes for provider code that drives
hardware queues directly.  softnic has no device memory to write to: the barriers are
no-ops (the engine reads memory under the interpreter's own ordering) and MMIO writes
refuse."""

import errno

from .pyverbs_error import PyverbsRDMAError


def udma_to_dev_barrier():
    pass


def udma_from_dev_barrier():
    pass


def mmio_write64_as_be(addr, val):
    raise PyverbsRDMAError('softnic has no MMIO space', errno.EOPNOTSUPP)


def mmio_write32_as_be(addr, val):
    raise PyverbsRDMAError('softnic has no MMIO space', errno.EOPNOTSUPP)
