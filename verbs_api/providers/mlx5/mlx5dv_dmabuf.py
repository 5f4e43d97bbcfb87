"""``pyverbs.providers.mlx5.mlx5dv_dmabuf``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse


class Mlx5DmaBufMR(PyverbsObject):
    def __init__(self, pd, offset, length, iova=0, fd=None, access=0, mlx5_access=0):
        refuse('Mlx5DmaBufMR', 'MLX5')


__all__ = ['Mlx5DmaBufMR']
