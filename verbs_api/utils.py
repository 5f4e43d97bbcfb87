"""String helpers of ``pyverbs.utils``, plus a few that pyverbs' tests use with them."""

from __future__ import annotations

import struct

from .pyverbs_error import PyverbsUserError
from . import enums as e


def be64toh(num):
    return struct.unpack('Q', struct.pack('!Q', num))[0]


def gid_str(subnet_prefix, interface_id):
    """A GID from its two halves as stored (big-endian memory read as host ints),
    in pyverbs' 8-group form 'xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx:xxxx'."""
    h = '%016x%016x' % (be64toh(subnet_prefix), be64toh(interface_id))
    return ':'.join(h[i:i + 4] for i in range(0, 32, 4))


def gid_str_to_array(val):
    """'xxxx:...' (8 groups of 4 hex digits) -> 16 two-digit hex strings, one per byte."""
    groups = val.split(':')
    if len(groups) != 8 or any(len(g) != 4 for g in groups):
        raise PyverbsUserError(f'Invalid GID value ({groups})')
    int(''.join(groups), 16)
    out = []
    for g in groups:
        out.append(g[0:2])
        out.append(g[2:4])
    return out


def qp_type_to_str(qp_type):
    types = {2: 'RC', 3: 'UC', 4: 'UD', 8: 'Raw Packet', 9: 'XRCD_SEND', 10: 'XRCD_RECV',
             0xff: 'Driver QP'}
    return types.get(qp_type, f'Unknown ({qp_type})')


def qp_state_to_str(qp_state):
    states = {0: 'Reset', 1: 'Init', 2: 'RTR', 3: 'RTS', 4: 'SQD', 5: 'SQE', 6: 'Error',
              7: 'Unknown'}
    return states.get(qp_state, f'Unknown ({qp_state})')


def mtu_to_str(mtu):
    return {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}.get(mtu, 0)


def access_flags_to_str(flags):
    names = {1: 'Local write', 2: 'Remote write', 4: 'Remote read', 8: 'Remote atomic',
             16: 'MW bind', 32: 'Zero based', 64: 'On demand'}
    return ''.join(f'{n} ' for f, n in names.items() if flags & f)


def mig_state_to_str(mig):
    return {0: 'Migrated', 1: 'Re-arm', 2: 'Armed'}.get(mig, f'Unknown ({mig})')


def rereg_error_to_str(error):
    names = {e.IBV_REREG_MR_ERR_INPUT: 'IBV_REREG_MR_ERR_INPUT',
             e.IBV_REREG_MR_ERR_DONT_FORK_NEW: 'IBV_REREG_MR_ERR_DONT_FORK_NEW',
             e.IBV_REREG_MR_ERR_DO_FORK_OLD: 'IBV_REREG_MR_ERR_DO_FORK_OLD',
             e.IBV_REREG_MR_ERR_CMD: 'IBV_REREG_MR_ERR_CMD',
             e.IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW: 'IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW'}
    return names.get(error, f'Unknown error ({error})')


def wc_status_to_str(status):
    names = ('Success', 'Local length error', 'local QP operation error',
             'Local EEC operation error', 'Local protection error', 'WR flush error',
             'Memory window bind error', 'Bad response error', 'Local access error',
             'Remote invalidate request error', 'Remote access error', 'Remote operation error',
             'Retry exceeded', 'RNR retry exceeded', 'Local RDD violation error',
             'Remote invalidate RD request error', 'Remote abort error',
             'Invalidate EECN error', 'Invalidate EEC state error', 'Fatal error',
             'Response timeout error', 'General error')
    if 0 <= status < len(names):
        return names[status]
    return f'Unknown WC status ({status})'
