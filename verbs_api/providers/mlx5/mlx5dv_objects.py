"""``pyverbs.providers.mlx5.mlx5dv_objects``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse


class Mlx5DvPD(PyverbsObject):
    def __init__(self):
        super().__init__()


class Mlx5DvCQ(PyverbsObject):
    def __init__(self):
        super().__init__()


class Mlx5DvQP(PyverbsObject):
    def __init__(self):
        super().__init__()


class Mlx5DvSRQ(PyverbsObject):
    def __init__(self):
        super().__init__()


class Mlx5DvObj(PyverbsObject):
    def __init__(self, obj_type=None, **kwargs):
        super().__init__()
        self.obj_type = obj_type
        self.kwargs = kwargs


__all__ = ['Mlx5DvPD',
           'Mlx5DvCQ',
           'Mlx5DvQP',
           'Mlx5DvSRQ',
           'Mlx5DvObj']
