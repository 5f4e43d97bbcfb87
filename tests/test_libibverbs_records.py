"""The C face's flat work-request records become the engine's work requests field by
field (``backend._send_wr``, ``_sges``): each field of ``SendWR`` from the record's
field of that name, whatever order the two are written in; and the engine's
completions become the program's records the same way (``_write_wcs``)."""

from __future__ import annotations

import dataclasses
import types

import pytest

from softnic.core.qp import SendWR
from softnic.faces.libibverbs import backend, build

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


# ------------------------------------------------------------ completions (struct sn_wc)

def _api_ffi(wc_decl: str | None = None):
    """api.h's records (with ``wc_decl`` in place of its struct sn_wc)."""
    src = (build.LIBRARY.here / "api.h").read_text()
    if wc_decl is not None:
        start = src.index("struct sn_wc {")
        src = src[:start] + wc_decl + src[src.index("};", start) + 2:]
    return build.LIBRARY.records_ffi(src)


#: the engine's WC fields that struct sn_wc carries as they are (the rest: below)
WC_SAME = ("wr_id", "status", "opcode", "vendor_err", "byte_len", "qp_num", "src_qp",
           "pkey_index", "slid", "dlid_path_bits")


def _wc(flags: int, base: int):
    values = {name: base + i for i, name in enumerate(WC_SAME)}
    return types.SimpleNamespace(wc_flags=flags, imm_data=base + 40, invalidated_rkey=base + 41,
                                 sl=base + 42, **values), values


#: api.h's struct sn_wc with its fields widened and moved apart, in the same order
WIDE = ("struct sn_wc { uint64_t wr_id; int64_t status; int opcode; uint64_t vendor_err; "
        "uint32_t byte_len; uint32_t imm_data; uint64_t qp_num; uint32_t src_qp; "
        "unsigned int wc_flags; uint32_t pkey_index; uint16_t slid; uint16_t sl; "
        "uint64_t dlid_path_bits; };")


@pytest.mark.parametrize("decl", [None, WIDE], ids=["api.h", "widened and moved"])
def test_each_completion_field_lands_in_its_namesake(decl):
    """``_write_wcs`` writes each WC into the program's array: every field at its
    own place (distinct values, so a swap shows), the invalidated rkey in imm_data
    with IBV_WC_WITH_INV, the L3 header type in sl with IBV_WC_GRH, and nothing
    past the completions given; where the fields are, how wide and how far apart
    the records are, as the struct the C side was built with says."""
    ffi = _api_ffi(decl)
    wc = backend._wc_struct(ffi)
    one = ffi.sizeof("struct sn_wc")
    assert wc.size == one
    out = ffi.new("struct sn_wc[4]")
    ffi.memmove(out, b"\xee" * ffi.sizeof(out), ffi.sizeof(out))
    got = [_wc(0, 10), _wc(backend._WC_WITH_INV, 60), _wc(backend._WC_GRH, 110)]
    backend._write_wcs(ffi, wc, out, [w for w, _ in got], 2)
    for i, (w, values) in enumerate(got):
        for name, v in values.items():
            assert getattr(out[i], name) == v, (i, name)
        assert out[i].wc_flags == w.wc_flags
    assert (out[0].imm_data, out[1].imm_data, out[2].imm_data) == (50, 101, 150)
    assert (out[0].sl, out[1].sl, out[2].sl) == (52, 102, 2)
    assert bytes(ffi.buffer(out + 3, one)) == b"\xee" * one


@pytest.mark.parametrize("decl", [
    # two fields swapped
    "struct sn_wc { uint64_t wr_id; int opcode; int status; uint32_t vendor_err; "
    "uint32_t byte_len; uint32_t imm_data; uint32_t qp_num; uint32_t src_qp; "
    "unsigned int wc_flags; uint16_t pkey_index; uint16_t slid; uint8_t sl; "
    "uint8_t dlid_path_bits; };",
    # a field more
    WIDE.replace("uint16_t slid;", "uint16_t slid; uint8_t pad;"),
])
def test_a_completion_record_whose_fields_differ_is_refused(decl):
    """The C face refuses to start (``install``) with a struct sn_wc whose fields
    are not the ones ``_write_wcs`` writes, in its order."""
    with pytest.raises(RuntimeError, match="struct sn_wc"):
        backend._wc_struct(_api_ffi(decl))
