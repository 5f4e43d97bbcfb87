"""Hypothesis strategies for property-testing RDMA protocols on softnic.

A protocol built on RDMA (a ring buffer, an RPC layer, a replicated log) has
to be right whatever the network does and whatever the peer posts.  These
strategies generate the three things such a test varies, as plain data:

``fault_models(max_loss=0.1, ...)``
    ``softnic.driver.faults.FaultModel`` values for a simulated link: i.i.d. loss,
    Gilbert-Elliott bursts, reordering, duplication, corruption, delay and
    jitter (and a rate limit if asked for).  Each fault is either off or on
    with its own parameters, so a failing example shrinks fault by fault
    toward a perfect link: what is left is the fault pattern the failure
    needs.  Probabilities are drawn on a 1e-6 grid and times on a 1 ns grid,
    so shrunk models print as round numbers.

``loss_patterns(n, max_drops=None)``
    Exact drop patterns: a ``frozenset`` of send indices in ``range(n)``.
    Put one on a link direction with ``DropList`` (``fabric.set_injector``)
    and a failure shrinks to "drop datagrams 3 and 7", not to a probability
    and a seed.  Prefer these where the question is "which loss breaks it".

``work_requests(buffer_size, ...)``
    Lists of ``WorkRequest``: every RC opcode (RDMA WRITE with and without
    immediate, SEND with and without immediate, RDMA READ, both atomics)
    with lengths and offsets inside the buffers.  ``to_send_wr`` turns one
    into a ``SendWR``.

``qp_attrs(...)``
    ``QPAttrs``: path MTU, the two start PSNs (near the 24-bit wrap too),
    timeout, retry_cnt, rnr_retry, min_rnr_timer, max_rd_atomic, go-back-N or
    selective repeat.  ``QPAttrs.connect(a, b)`` brings up a QP pair with them.

Everything shrinks toward the plain case: a perfect link, no drops, a
zero-length RDMA WRITE at offset 0, and the attributes ``softnic.experiments.rig``
uses by default (1024-byte MTU, PSN 0, timeout 14, seven retries, go-back-N).

A test puts these together with ``softnic.transport.sim.Fabric``::

    @given(drops=loss_patterns(40, max_drops=6), wrs=work_requests(4096), attrs=qp_attrs())
    def test_my_protocol(drops, wrs, attrs):
        fabric = Fabric(seed=0)
        a, b = Device("a", "10.0.0.1"), Device("b", "10.0.0.2")
        fabric.attach(a); fabric.attach(b)
        DropList(drops).install(fabric, a.address, b.address)
        ea, eb = attrs.connect(a, b)
        ...

See docs/testing.md and examples/ring_buffer_property.py.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from softnic.core.enums import SendFlags, WROpcode
from softnic.core.qp import SendWR
from softnic.core.wr_opcode import ATOMICS as _ATOMICS, MAY_INLINE as _INLINE_OK, \
    REMOTE as _USES_REMOTE, TAKES_RECV as _CONSUMES_RECV, WITH_IMM as _WITH_IMM
from softnic.driver.faults import DEFAULT_QUEUE_BYTES, FaultModel
from softnic.testing.droplist import DropList, describe_datagram

__all__ = [
    "fault_models", "loss_patterns", "work_requests", "qp_attrs",
    "DropList", "describe_datagram", "WorkRequest", "QPAttrs", "RC_OPCODES",
]

PSN_MODULUS = 1 << 24

# Probabilities are drawn as k / _P and times as k / _NS, so shrunk values are round.
_P = 1_000_000
_NS = 1_000_000_000


# ---------------------------------------------------------------- fault models


def fault_models(*, max_loss: float = 0.1, bursts: bool = True, max_reorder: float = 0.05,
                 max_reorder_delay: float = 50e-6, max_duplicate: float = 0.05,
                 max_corrupt: float = 0.05, max_corrupt_bits: int = 4,
                 max_delay: float = 20e-6, max_jitter: float = 10e-6,
                 rates: tuple[float, float] | None = None) -> SearchStrategy[FaultModel]:
    """``FaultModel`` values for one link direction (or a fabric's default).

    Each fault is switched on or off by its own draw and, when on, gets its
    parameters: ``loss`` in (0, max_loss]; Gilbert-Elliott bursts
    (``bursts=True``): ``p_enter_bad`` in (0, 0.05], ``p_leave_bad`` in
    [0.1, 1], ``loss_bad`` in (0, 1]; ``reorder`` in (0, max_reorder] held
    back 1 ns .. max_reorder_delay; ``duplicate`` in (0, max_duplicate];
    ``corrupt`` in (0, max_corrupt] flipping 1..max_corrupt_bits bits;
    ``delay`` in (0, max_delay]; ``jitter`` in (0, max_jitter]; and, only
    when ``rates=(low, high)`` is given, a rate limit in [low, high] bits/s
    with a queue of up to 1 MiB.  A maximum of 0 leaves that fault out.

    Shrinking switches faults off (a perfect link is the simplest model)
    and moves each parameter toward its mildest value.  The fabric draws
    every fault decision from one random stream, so switching off a fault
    that never fired still changes which packets the others hit: shrunk
    models may keep a fault that does nothing.  ``loss_patterns`` shrinks
    exactly.
    """
    _check_fault_bounds(max_loss, max_reorder, max_reorder_delay, max_duplicate, max_corrupt,
                        max_corrupt_bits, max_delay, max_jitter, rates)

    loss = _probability(max_loss)
    reorder = _probability(max_reorder)
    duplicate = _probability(max_duplicate)
    corrupt = _probability(max_corrupt)
    delay = _duration(max_delay)
    jitter = _duration(max_jitter)
    reorder_delay = _duration(max_reorder_delay)

    leave_bad = st.integers(0, 9 * _P // 10).map(lambda k: (_P - k) / _P)   # toward 1: short bursts
    loss_bad = st.integers(0, _P - 1).map(lambda k: (_P - k) / _P)         # toward 1: the default
    queue = st.integers(0, DEFAULT_QUEUE_BYTES).map(lambda k: DEFAULT_QUEUE_BYTES - k)
    faults = [  # (fields, their strategies); a None strategy leaves the fault out
        (("loss",), (loss,)),
        (("p_enter_bad", "p_leave_bad", "loss_bad"),
         (_probability(0.05) if bursts else None, leave_bad, loss_bad)),
        (("reorder", "reorder_delay"), (reorder, reorder_delay)),
        (("duplicate",), (duplicate,)),
        (("corrupt", "corrupt_bits"), (corrupt, st.integers(1, max_corrupt_bits))),
        (("delay",), (delay,)),
        (("jitter",), (jitter,)),
        (("rate_bps", "queue_bytes"),
         (st.floats(*rates) if rates is not None else None, queue)),
    ]
    faults = [(names, strategies) for names, strategies in faults if None not in strategies]

    @st.composite
    def build(draw) -> FaultModel:
        kw: dict = {}
        for names, strategies in faults:
            # The parameters are drawn even when the fault is off, so that
            # switching one fault off while shrinking leaves the draws after
            # it (the other faults, the test's own) where they were.
            on = draw(st.booleans())
            values = [draw(s) for s in strategies]
            if on:
                kw.update(zip(names, values))
        return FaultModel(**kw)

    return build()


def _check_fault_bounds(max_loss, max_reorder, max_reorder_delay, max_duplicate, max_corrupt,
                        max_corrupt_bits, max_delay, max_jitter, rates) -> None:
    """fault_models' arguments, or InvalidArgument naming the bad one."""
    for name, value in (("max_loss", max_loss), ("max_reorder", max_reorder),
                        ("max_duplicate", max_duplicate), ("max_corrupt", max_corrupt)):
        if not 0.0 <= value <= 1.0:
            raise InvalidArgument(f"fault_models({name}={value!r}): a probability in [0, 1]")
    for name, value in (("max_reorder_delay", max_reorder_delay), ("max_delay", max_delay),
                        ("max_jitter", max_jitter)):
        if not 0.0 <= value < 3600.0:
            raise InvalidArgument(f"fault_models({name}={value!r}): seconds, >= 0")
    if max_reorder and max_reorder_delay * _NS < 1:
        raise InvalidArgument("fault_models: reordering needs max_reorder_delay >= 1 ns "
                              "(or max_reorder=0)")
    if isinstance(max_corrupt_bits, bool) or not isinstance(max_corrupt_bits, int) \
            or max_corrupt_bits < 1:
        raise InvalidArgument(f"fault_models(max_corrupt_bits={max_corrupt_bits!r}): an int >= 1")
    if rates is not None:
        low, high = rates
        if not 0.0 < low <= high < float("inf"):
            raise InvalidArgument(f"fault_models(rates={rates!r}): 0 < low <= high bits/s")


def _probability(maximum: float) -> SearchStrategy[float] | None:
    """(0, maximum] on a 1e-6 grid, shrinking toward the smallest step; None if empty."""
    top = int(maximum * _P)
    return st.integers(1, top).map(lambda k: k / _P) if top >= 1 else None


def _duration(maximum: float) -> SearchStrategy[float] | None:
    """(0, maximum] seconds on a 1 ns grid; None if empty."""
    top = int(round(maximum * _NS))
    return st.integers(1, top).map(lambda k: k / _NS) if top >= 1 else None


# ---------------------------------------------------------------- drop patterns


def loss_patterns(n: int, *, min_drops: int = 0,
                  max_drops: int | None = None) -> SearchStrategy[frozenset[int]]:
    """Which of the first ``n`` datagrams of a link direction to drop.

    A ``frozenset`` of send indices in ``range(n)``, of ``min_drops`` to
    ``max_drops`` elements; give it to ``DropList``.  Shrinks toward fewer
    drops and earlier indices, so a failure reads as the fewest, earliest
    losses that still break the protocol.  Pick ``n`` around the number of
    datagrams the direction carries in one run (``DropList.counters["sent"]``
    after a clean run tells you).  ``max_drops`` keeps the pattern below what
    exhausts the QP's ``retry_cnt``, if the test expects the link to recover.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidArgument(f"loss_patterns(n={n!r}): an int >= 0")
    if max_drops is not None and max_drops < min_drops:
        raise InvalidArgument(f"loss_patterns: max_drops={max_drops} < min_drops={min_drops}")
    if min_drops > n:
        raise InvalidArgument(f"loss_patterns: min_drops={min_drops} > n={n}")
    if n == 0:
        return st.just(frozenset())
    # A list of indices made into a set, not st.frozensets: Hypothesis shrinks
    # plain lists by deleting elements, and a unique collection less well.
    patterns = st.lists(st.integers(0, n - 1), min_size=min_drops,
                        max_size=max_drops).map(frozenset)
    if min_drops > 1:
        patterns = patterns.filter(lambda s: len(s) >= min_drops)
    return patterns


# ---------------------------------------------------------------- work requests

# The order is the shrinking order: a failing list shrinks toward the first.
RC_OPCODES: tuple[WROpcode, ...] = (
    WROpcode.RDMA_WRITE,
    WROpcode.RDMA_WRITE_WITH_IMM,
    WROpcode.SEND,
    WROpcode.SEND_WITH_IMM,
    WROpcode.RDMA_READ,
    WROpcode.ATOMIC_FETCH_AND_ADD,
    WROpcode.ATOMIC_CMP_AND_SWP,
)



@dataclass(frozen=True)
class WorkRequest:
    """One RC send-queue work request as plain data, relative to two buffers.

    ``local_offset``/``length`` is the local SGE: the source of a WRITE or
    SEND, the destination of a READ, where an atomic's original value lands
    (always 8 bytes).  ``remote_offset`` is where a WRITE, READ or atomic
    acts in the peer's buffer (8-aligned for atomics, 0 and unused for
    SENDs, whose bytes land wherever the peer's receive says).
    """

    opcode: WROpcode
    length: int = 0
    local_offset: int = 0
    remote_offset: int = 0
    imm_data: int = 0        # SEND_WITH_IMM, RDMA_WRITE_WITH_IMM
    compare_add: int = 0     # the add of FETCH_AND_ADD, the compare of CMP_AND_SWP
    swap: int = 0            # CMP_AND_SWP
    signaled: bool = True
    inline: bool = False
    fence: bool = False

    @property
    def consumes_recv(self) -> bool:
        """SEND, SEND_WITH_IMM and RDMA_WRITE_WITH_IMM each take one receive WQE at the peer."""
        return self.opcode in _CONSUMES_RECV

    @property
    def is_atomic(self) -> bool:
        return self.opcode in _ATOMICS

    def to_send_wr(self, wr_id: int, *, local_addr: int, lkey: int, remote_addr: int = 0,
                   rkey: int = 0) -> SendWR:
        """The ``SendWR``, given the local buffer's address and lkey and the peer
        buffer's address and rkey (with ``softnic.experiments.rig``: ``ep.buf.addr``,
        ``ep.mr.lkey``, ``peer.buf.addr``, ``peer.mr.rkey``)."""
        flags = 0
        if self.signaled:
            flags |= SendFlags.SIGNALED
        if self.inline:
            flags |= SendFlags.INLINE
        if self.fence:
            flags |= SendFlags.FENCE
        wr = SendWR(wr_id=wr_id, opcode=self.opcode,
                    sg_list=[(local_addr + self.local_offset, self.length, lkey)],
                    send_flags=flags, imm_data=self.imm_data)
        if self.opcode in _USES_REMOTE:
            wr.remote_addr = remote_addr + self.remote_offset
            wr.rkey = rkey
        if self.is_atomic:
            wr.compare_add = self.compare_add
            wr.swap = self.swap
        return wr


def work_requests(buffer_size: int = 4096, *, remote_buffer_size: int | None = None,
                  opcodes: Iterable[WROpcode] = RC_OPCODES, min_size: int = 1,
                  max_size: int = 8, max_length: int | None = None, max_inline: int = 0,
                  unsignaled: bool = False, fences: bool = False,
                  disjoint: bool = False) -> SearchStrategy[list[WorkRequest]]:
    """Lists of ``min_size`` to ``max_size`` ``WorkRequest`` values.

    Local ranges lie in ``[0, buffer_size)`` and remote ones in
    ``[0, remote_buffer_size)`` (default: the same size).  Lengths run up to
    ``max_length`` (default: the smaller buffer), mostly small, sometimes
    large; atomics are 8 bytes at an 8-aligned remote offset.  Opcodes come
    from ``opcodes`` (default ``RC_OPCODES``, every RC opcode; shrinking goes
    toward the first).  Immediates are 32-bit, atomic operands 64-bit.

    ``max_inline`` > 0 lets SENDs and WRITEs up to that length be inline;
    ``unsignaled=True`` makes some WRs unsignaled (never the last, so a test
    can wait for it); ``fences=True`` sets the fence flag on some.

    Ranges may overlap unless ``disjoint=True``, which gives every WR its
    own local and remote bytes (packed from offset 0 up, with gaps): then
    the order in which WRs execute cannot change the final memory, and a
    reference model is a plain copy per WR.  Overlapping WRs are legal, but
    a READ and a later WR touching the same local bytes race unless fenced.
    """
    remote_size, ops, cap = _check_wr_bounds(buffer_size, remote_buffer_size, opcodes,
                                             min_size, max_size, max_length)

    @st.composite
    def build(draw) -> list[WorkRequest]:
        count = draw(st.integers(min_size, max_size))
        local_free, remote_free = 0, 0      # disjoint: first byte not handed out yet
        out = []
        for i in range(count):
            # Every WR makes the same draws in the same order, whatever its
            # opcode (unused ones are ignored), so that when shrinking changes
            # an opcode the draws after it keep their meaning.
            local_room = buffer_size - local_free
            remote_base = (remote_free + 7) & ~7 if disjoint else 0
            atomic_fits = local_room >= 8 and remote_size - remote_base >= 8
            choices = [op for op in ops if op not in _ATOMICS or atomic_fits]
            if not choices:         # disjoint, only atomics asked for, and no room left
                break
            op = draw(st.sampled_from(choices))
            uses_remote = op in _USES_REMOTE
            room = min(cap, local_room)
            if uses_remote:
                room = min(room, remote_size - remote_free)
            length = draw(_lengths(room))
            local = local_free + draw(st.integers(0, local_room - length))
            remote = remote_free + draw(st.integers(0, max(0, remote_size - remote_free - length)))
            imm = draw(st.integers(0, 2**32 - 1))
            compare_add = draw(st.integers(0, 2**64 - 1))
            swap = draw(st.integers(0, 2**64 - 1))
            inline = bool(max_inline) and draw(st.booleans())
            signaled = not (unsignaled and i < count - 1 and draw(st.booleans()))
            fence = fences and draw(st.booleans())
            if op in _ATOMICS:
                length = 8
                local = min(local, buffer_size - 8)
                remote = min(remote_base + (remote - remote_free) // 8 * 8,
                             remote_base + (remote_size - remote_base - 8) // 8 * 8)
            wr = WorkRequest(
                op, length, local, remote if uses_remote else 0,
                imm_data=imm if op in _WITH_IMM else 0,
                compare_add=compare_add if op in _ATOMICS else 0,
                swap=swap if op == WROpcode.ATOMIC_CMP_AND_SWP else 0,
                signaled=signaled, fence=fence,
                inline=inline and op in _INLINE_OK and length <= max_inline)
            out.append(wr)
            if disjoint:
                local_free = local + length
                if uses_remote:
                    remote_free = remote + length
        return out

    return build()


def _check_wr_bounds(buffer_size, remote_buffer_size, opcodes, min_size, max_size, max_length):
    """work_requests' arguments as (remote buffer size, opcodes, longest length; atomics
    left out where they cannot fit), or InvalidArgument naming the bad one."""
    remote_size = buffer_size if remote_buffer_size is None else remote_buffer_size
    ops = tuple(WROpcode(o) for o in opcodes)
    for name, value in (("buffer_size", buffer_size), ("remote_buffer_size", remote_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"work_requests({name}={value!r}): an int >= 0")
    if not ops:
        raise InvalidArgument("work_requests: opcodes is empty")
    for op in ops:
        if op not in RC_OPCODES:
            raise InvalidArgument(f"work_requests: {op.name} is not one of RC_OPCODES")
    if not 0 <= min_size <= max_size:
        raise InvalidArgument(f"work_requests: need 0 <= min_size <= max_size, got "
                              f"{min_size}, {max_size}")
    cap = min(buffer_size, remote_size)
    if max_length is not None:
        if max_length < 0:
            raise InvalidArgument(f"work_requests(max_length={max_length!r}): >= 0")
        cap = min(cap, max_length)
    if buffer_size < 8 or remote_size < 8:
        ops = tuple(op for op in ops if op not in _ATOMICS)
        if not ops:
            raise InvalidArgument("work_requests: atomics need buffers of 8 bytes or more")
    return remote_size, ops, cap


def _lengths(top: int) -> SearchStrategy[int]:
    """0..top, mostly small (header-sized and MTU-sized messages), sometimes anything."""
    return st.one_of(st.integers(0, min(top, 64)), st.integers(0, min(top, 9000)),
                     st.integers(0, top))


# ---------------------------------------------------------------- QP attributes


@dataclass(frozen=True)
class QPAttrs:
    """Attributes of one connected RC QP pair (a's QP and b's QP).

    ``path_mtu`` is in bytes; ``psn_a`` is the first PSN a sends (b expects
    it), ``psn_b`` the other way; ``timeout``, ``retry_cnt``, ``rnr_retry``,
    ``min_rnr_timer`` and ``max_rd_atomic`` are the verbs values (``timeout``
    0 means no retransmission timer, ``rnr_retry`` 7 retries forever);
    ``selective_repeat`` picks loss recovery for both QPs (False: the spec's
    go-back-N).  The defaults are ``softnic.experiments.rig``'s.
    """

    path_mtu: int = 1024
    psn_a: int = 0
    psn_b: int = 0
    timeout: int = 14
    retry_cnt: int = 7
    rnr_retry: int = 7
    min_rnr_timer: int = 1
    max_rd_atomic: int = 16
    selective_repeat: bool = False

    def bring_up_args(self) -> dict:
        """Keyword arguments for ``softnic.experiments.rig.bring_up`` / ``connect``
        (but the PSNs)."""
        return dict(mtu=self.path_mtu, timeout=self.timeout, retry_cnt=self.retry_cnt,
                    rnr_retry=self.rnr_retry, min_rnr_timer=self.min_rnr_timer,
                    max_rd_atomic=self.max_rd_atomic)

    def connect(self, a, b, **kwargs):
        """``softnic.experiments.rig.connect(a, b, ...)`` with these attributes; returns the two
        endpoints.  ``kwargs`` go to ``connect`` (e.g. ``endpoint_args``)."""
        from softnic.experiments.rig import connect

        ea, eb = connect(a, b, psn_a=self.psn_a, psn_b=self.psn_b, **self.bring_up_args(),
                         **kwargs)
        for ep in (ea, eb):
            ep.dev.set_qp_transport(ep.qp, selective_repeat=self.selective_repeat)
        return ea, eb


_MTUS = (1024, 256, 512, 2048, 4096)


def qp_attrs(*, path_mtu=_MTUS, psn=None, psn_wrap_window: int = 64, timeout=range(1, 17),
             retry_cnt=range(0, 8), rnr_retry=range(0, 8), min_rnr_timer=range(0, 32),
             max_rd_atomic=range(1, 17),
             selective_repeat=(False, True)) -> SearchStrategy[QPAttrs]:
    """``QPAttrs`` for a connected RC pair.

    Every argument is a fixed value, a collection of values to choose from,
    or a Hypothesis strategy.  Start PSNs are anywhere in 24 bits or, as
    often, within ``psn_wrap_window`` of the wrap (pass ``psn`` to override
    both).  Collections shrink toward ``softnic.experiments.rig``'s defaults (MTU 1024,
    timeout 14, seven retries, RNR timer 1, 16 reads/atomics, go-back-N) and
    PSNs toward 0.

    The default ``timeout`` range stops at 16 (0.27 s) so that retries fit a
    test's time budget; ``retry_cnt`` n is n retries since the last progress
    (7 too: only ``rnr_retry`` 7 is unlimited), so any value can exhaust under
    heavy loss, which is a fair outcome to test (the QP goes to ERR); pass
    ``retry_cnt=7`` if the test assumes the link recovers (eight losses in a
    row of one packet then fail it).
    """
    if psn is None:
        if not 0 < psn_wrap_window <= PSN_MODULUS:
            raise InvalidArgument(f"qp_attrs(psn_wrap_window={psn_wrap_window!r}): 1..2**24")
        psn = st.one_of(st.integers(0, PSN_MODULUS - 1),
                        st.integers(PSN_MODULUS - psn_wrap_window, PSN_MODULUS - 1))
    parts = dict(
        path_mtu=_choice("path_mtu", path_mtu, 1024),
        psn_a=_choice("psn", psn, 0),
        psn_b=_choice("psn", psn, 0),
        timeout=_choice("timeout", timeout, 14),
        retry_cnt=_choice("retry_cnt", retry_cnt, 7),
        rnr_retry=_choice("rnr_retry", rnr_retry, 7),
        min_rnr_timer=_choice("min_rnr_timer", min_rnr_timer, 1),
        max_rd_atomic=_choice("max_rd_atomic", max_rd_atomic, 16),
        selective_repeat=_choice("selective_repeat", selective_repeat, False),
    )
    return st.builds(QPAttrs, **parts)


def _choice(name: str, spec, default) -> SearchStrategy:
    """A strategy from a fixed value, a collection (shrinking toward ``default``,
    then the nearest values) or a strategy."""
    if isinstance(spec, SearchStrategy):
        return spec
    if isinstance(spec, Collection) and not isinstance(spec, (str, bytes)):
        values = list(spec)
        if not values:
            raise InvalidArgument(f"qp_attrs({name}=...): no values to choose from")
        if all(isinstance(v, int) for v in values):
            values.sort(key=lambda v: (abs(v - default), v))
        return st.sampled_from(values)
    return st.just(spec)
