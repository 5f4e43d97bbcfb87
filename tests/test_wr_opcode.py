"""The work-request opcode table (``softnic.core.wr_opcode``, as rxe's
``rxe_wr_opcode_info[]``) against the wire's opcode table (``wire.roce.OPCODES``):
two tables written from two lists of the IBA, each fact once, that must agree."""

from __future__ import annotations

from softnic.core.enums import QPType, WCOpcode, WROpcode as W
from softnic.core import wr_opcode as T
from softnic.wire.roce import Kind, OPCODES, Opcode as O


def test_every_wr_opcode_has_one_row():
    assert set(T.WR_OPCODES) == set(W)
    for op, info in T.WR_OPCODES.items():
        assert info.opcode is op and info.name == op.name


def test_the_wr_table_agrees_with_the_wire_table():
    """A WR's masks say what its packets carry: ``wire.roce.OPCODES`` is the
    other table, written from the IBA's opcode list."""
    M = T.WRMask
    for op, info in T.WR_OPCODES.items():
        if info.wire is None:
            assert info.mask & M.LOCAL
            continue
        assert not info.mask & M.LOCAL
        first, middle, last, only = (OPCODES.get(o) if o is not None else None
                                     for o in info.wire)
        assert only is not None and only.first and only.last and only.is_request
        assert bool(info.mask & M.RETH) == (only.reth or only.atomiceth)
        assert bool(info.mask & M.IMM) == only.immdt
        assert bool(info.mask & M.INV) == only.ieth
        assert bool(info.mask & M.ATOMIC) == (only.kind == Kind.ATOMIC)
        # a READ or atomic-like request: answered by a response of its own
        assert bool(info.mask & M.RD_ATOMIC) == (
            only.kind in (Kind.READ_REQUEST, Kind.ATOMIC, Kind.ATOMIC_WRITE, Kind.FLUSH))
        # takes a receive WQE: a SEND, or a WRITE whose last packet brings an immediate
        assert bool(info.mask & M.RECV) == (only.kind == Kind.SEND or only.immdt)
        assert bool(info.mask & M.INLINE) == (only.kind in (Kind.SEND, Kind.WRITE))
        if middle is None:
            assert first is None and last is None
        else:
            assert (first.first, first.last, middle.first, middle.last, last.first,
                    last.last) == (True, False, False, False, False, True)
            assert first.kind == middle.kind == last.kind == only.kind
            assert (last.immdt, last.ieth) == (only.immdt, only.ieth)
        for t in info.qp_types:          # a UC (or UD) QP posts it only where the wire has it
            if t is QPType.UC:
                assert all(O(0x20 | o).name == "UC_" + O(o).name[3:]
                           for o in info.wire if o is not None)
            if t is QPType.UD:
                assert info.mask & M.SEND


def test_the_derived_sets():
    assert T.RD_ATOMIC == {W.RDMA_READ, W.ATOMIC_CMP_AND_SWP, W.ATOMIC_FETCH_AND_ADD,
                           W.ATOMIC_WRITE, W.FLUSH}
    assert T.MAY_INLINE == {W.SEND, W.SEND_WITH_IMM, W.SEND_WITH_INV, W.RDMA_WRITE,
                            W.RDMA_WRITE_WITH_IMM}
    assert T.ALLOWED[QPType.UD] == {W.SEND, W.SEND_WITH_IMM}
    assert T.ALLOWED[QPType.RC] == set(W)
    assert T.WC_OPCODE[W.SEND_WITH_INV] is WCOpcode.SEND
    assert T.only_opcode(W.RDMA_WRITE_WITH_IMM) is O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
