"""The C face's flat work-request records become the engine's work requests field by
field (``backend._send_wr``, ``_sges``): each field of ``SendWR`` from the record's
field of that name, whatever order the two are written in."""

from __future__ import annotations

import dataclasses
import types

import pytest

from softnic.core.qp import SendWR
from softnic.faces.libibverbs import backend

#: ``struct sn_send_wr``'s fields that ``_send_wr`` carries over as they are
SAME = ("wr_id", "opcode", "send_flags", "imm_data", "invalidate_rkey", "remote_addr",
        "rkey", "compare_add", "swap", "remote_qpn", "remote_qkey")


def _qp(max_send_sge: int):
    return types.SimpleNamespace(eng=types.SimpleNamespace(
        cap=types.SimpleNamespace(max_send_sge=max_send_sge), xrc=None))


def _record(nsge: int):
    """A record whose every field holds a value no other field holds."""
    values = {name: 100 + i for i, name in enumerate(SAME)}
    sg = [types.SimpleNamespace(addr=1000 + 3 * i, length=1001 + 3 * i, lkey=1002 + 3 * i)
          for i in range(nsge)]
    return types.SimpleNamespace(sg_list=sg, num_sge=nsge, ah=0, **values), values


@pytest.mark.parametrize("nsge", [0, 1, 3])
def test_each_field_of_the_work_request_comes_from_its_namesake(nsge):
    rec, values = _record(nsge)
    wr = backend._send_wr(_qp(4), rec)
    assert isinstance(wr, SendWR)
    for name, v in values.items():
        assert getattr(wr, name) == v, name
    assert wr.sg_list == [(1000 + 3 * i, 1001 + 3 * i, 1002 + 3 * i) for i in range(nsge)]
    assert wr.ah is None
    defaults = SendWR()
    for f in dataclasses.fields(SendWR):
        if f.name not in values and f.name not in ("sg_list", "ah"):
            assert getattr(wr, f.name) == getattr(defaults, f.name), f.name


def test_a_list_longer_than_the_queue_takes_is_not_read():
    """(mlx5 checks the count before it reads an entry: the engine's count check
    refuses it with the errno of ``ibv_post_send``.)"""
    rec, _ = _record(3)
    rec.sg_list = None                   # reading an entry would fail
    wr = backend._send_wr(_qp(2), rec)
    assert wr.sg_list == [(0, 0, 0)] * 3
