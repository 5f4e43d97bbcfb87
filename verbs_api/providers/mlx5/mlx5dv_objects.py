"""``pyverbs.providers.mlx5.mlx5dv_objects``: its classes, each refusing on softnic (not an MLX5 device)."""

from .. import not_this_device

_NAMES = ['Mlx5DvCQ', 'Mlx5DvObj', 'Mlx5DvPD', 'Mlx5DvQP', 'Mlx5DvSRQ']

for _n in _NAMES:
    globals()[_n] = not_this_device(_n, 'MLX5', __name__)

__all__ = list(_NAMES)
