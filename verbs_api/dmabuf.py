"""``pyverbs.dmabuf``: a dma-buf allocated from a GPU render node (DRM GEM).

softnic's memory is host memory of the process; it does not allocate from GPUs.  As
rdma-core's pyverbs built without DRM support does, ``DmaBuf`` refuses with EOPNOTSUPP.
"""

import errno

from .base import PyverbsCM
from .pyverbs_error import PyverbsRDMAError


class DmaBuf(PyverbsCM):
    def __init__(self, size, gpu=0, gtt=0):
        super().__init__()
        self._closed = True
        raise PyverbsRDMAError(f'Failed to allocate dmabuf of size {size} on gpu {gpu}',
                               errno.EOPNOTSUPP)

    def close(self):
        self._closed = True
