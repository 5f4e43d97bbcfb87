"""``pyverbs.providers.mlx5.mlx5dv_mkey``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse
from . import mlx5_enums as dve


class Mlx5SigCrc(PyverbsObject):
    def __init__(self, crc_type=0, seed=0):
        super().__init__()
        self.crc_type = crc_type
        self.seed = seed


class Mlx5SigT10Dif(PyverbsObject):
    def __init__(self, bg_type=0, bg=0, app_tag=0, ref_tag=0, flags=0):
        super().__init__()
        self.bg_type = bg_type
        self.bg = bg
        self.app_tag = app_tag
        self.ref_tag = ref_tag
        self.flags = flags


class Mlx5SigBlockDomain(PyverbsObject):
    def __init__(self, sig_type=0, dif=None, crc=None, block_size=0, comp_mask=0):
        super().__init__()
        self.sig_type = sig_type
        self.dif = dif
        self.crc = crc
        self.block_size = block_size
        self.comp_mask = comp_mask


class Mlx5SigBlockAttr(PyverbsObject):
    def __init__(self, mem=None, wire=None, flags=0, check_mask=0, copy_mask=0, comp_mask=0):
        super().__init__()
        self.mem = mem
        self.wire = wire
        self.flags = flags
        self.check_mask = check_mask
        self.copy_mask = copy_mask
        self.comp_mask = comp_mask


class Mlx5SigErr(PyverbsObject):
    def __init__(self, actual_value=0, expected_value=0, offset=0):
        super().__init__()
        self.actual_value = actual_value
        self.expected_value = expected_value
        self.offset = offset


class Mlx5MkeyErr(PyverbsObject):
    def __init__(self, sig_err=Mlx5SigErr(), err_type=dve.MLX5DV_MKEY_NO_ERR):
        super().__init__()
        self.sig_err = sig_err
        self.err_type = err_type


class Mlx5MkeyConfAttr(PyverbsObject):
    def __init__(self, conf_flags=0, comp_mask=0):
        super().__init__()
        self.conf_flags = conf_flags
        self.comp_mask = comp_mask


class Mlx5MrInterleaved(PyverbsObject):
    def __init__(self, addr, bytes_count, bytes_skip, lkey):
        super().__init__()
        self.addr = addr
        self.bytes_count = bytes_count
        self.bytes_skip = bytes_skip
        self.lkey = lkey


class Mlx5Mkey(PyverbsObject):
    def __init__(self, pd, create_flags, max_entries):
        refuse('Mlx5Mkey', 'MLX5')


__all__ = ['Mlx5SigCrc',
           'Mlx5SigT10Dif',
           'Mlx5SigBlockDomain',
           'Mlx5SigBlockAttr',
           'Mlx5SigErr',
           'Mlx5MkeyErr',
           'Mlx5MkeyConfAttr',
           'Mlx5MrInterleaved',
           'Mlx5Mkey']
