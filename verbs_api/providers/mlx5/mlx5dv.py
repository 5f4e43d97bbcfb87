"""``pyverbs.providers.mlx5.mlx5dv``: its classes, each refusing on softnic (not an MLX5 device)."""

from .. import not_this_device

_NAMES = ['Mlx5CQ', 'Mlx5Context', 'Mlx5Cqe64', 'Mlx5DCIStreamInitAttr', 'Mlx5DVCQInitAttr', 'Mlx5DVContext', 'Mlx5DVContextAttr', 'Mlx5DVDCInitAttr', 'Mlx5DVPortAttr', 'Mlx5DVQPInitAttr', 'Mlx5DevxEq', 'Mlx5DevxMsiVector', 'Mlx5DevxObj', 'Mlx5DmOpAddr', 'Mlx5PP', 'Mlx5QP', 'Mlx5UAR', 'Mlx5UMEM', 'Mlx5VAR', 'Mlx5VfioAttr', 'Wqe', 'WqeCtrlSeg', 'WqeDataSeg', 'WqeSeg']

for _n in _NAMES:
    globals()[_n] = not_this_device(_n, 'MLX5', __name__)

__all__ = list(_NAMES)
