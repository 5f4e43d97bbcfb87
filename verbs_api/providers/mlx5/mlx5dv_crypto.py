"""``pyverbs.providers.mlx5.mlx5dv_crypto``, with the signatures of rdma-core's pyverbs.

softnic is no mlx5 device: the objects refuse as mlx5dv refuses on another vendor's
context (EOPNOTSUPP); the attribute classes hold what they are given."""

from __future__ import annotations

from ...base import PyverbsObject
from .. import refuse


class Mlx5CryptoLoginAttr(PyverbsObject):
    def __init__(self, credential, credential_id=0, import_kek_id=0):
        super().__init__()
        self.credential = credential
        self.credential_id = credential_id
        self.import_kek_id = import_kek_id


class Mlx5CryptoExtLoginAttr(PyverbsObject):
    def __init__(self, credential, credential_len, credential_id=0, import_kek_id=0):
        super().__init__()
        self.credential = credential
        self.credential_len = credential_len
        self.credential_id = credential_id
        self.import_kek_id = import_kek_id


class Mlx5DEKInitAttr(PyverbsObject):
    def __init__(self, pd, key_size, has_keytag=False, key_purpose=0, opaque=bytes(), key=bytes(),
                 comp_mask=0, crypto_login=None):
        super().__init__()
        self.pd = pd
        self.key_size = key_size
        self.has_keytag = has_keytag
        self.key_purpose = key_purpose
        self.opaque = opaque
        self.key = key
        self.comp_mask = comp_mask
        self.crypto_login = crypto_login


class Mlx5DEKAttr(PyverbsObject):
    def __init__(self):
        super().__init__()


class Mlx5CryptoAttr(PyverbsObject):
    def __init__(self, crypto_standard=0, encrypt_on_tx=False, signature_crypto_order=0,
                 data_unit_size=0, initial_tweak=bytes(), dek=None, keytag=bytes(), comp_mask=0):
        super().__init__()
        self.crypto_standard = crypto_standard
        self.encrypt_on_tx = encrypt_on_tx
        self.signature_crypto_order = signature_crypto_order
        self.data_unit_size = data_unit_size
        self.initial_tweak = initial_tweak
        self.dek = dek
        self.keytag = keytag
        self.comp_mask = comp_mask


class Mlx5DEK(PyverbsObject):
    def __init__(self, ctx, dek_init_attr):
        refuse('Mlx5DEK', 'MLX5')


class Mlx5CryptoLogin(PyverbsObject):
    def __init__(self, context, crypto_attr):
        refuse('Mlx5CryptoLogin', 'MLX5')


__all__ = ['Mlx5CryptoLoginAttr',
           'Mlx5CryptoExtLoginAttr',
           'Mlx5DEKInitAttr',
           'Mlx5DEKAttr',
           'Mlx5CryptoAttr',
           'Mlx5DEK',
           'Mlx5CryptoLogin']
