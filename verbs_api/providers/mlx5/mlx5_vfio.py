"""``pyverbs.providers.mlx5.mlx5_vfio``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse


class Mlx5VfioAttr(PyverbsObject):
    def __init__(self, pci_name, flags=0, comp_mask=0):
        super().__init__()
        self.pci_name = pci_name
        self.flags = flags
        self.comp_mask = comp_mask


class Mlx5VfioContext(PyverbsObject):
    def __init__(self, attr):
        refuse('Mlx5VfioContext', 'MLX5')


__all__ = ['Mlx5VfioAttr',
           'Mlx5VfioContext']
