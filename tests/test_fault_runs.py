"""A fault model that only drops, applied to a run of datagrams at once.

``FaultInjector.apply_run`` draws for a run what ``apply`` draws for each of its
datagrams, and ``NIC._surviving`` sends a run's survivors as slices of its
buffer.  Both must leave exactly what ``apply`` one datagram at a time leaves:
the same datagrams in the same order, the same counters, the same random state
afterwards (so a seeded run replays the same losses either way).
"""

from __future__ import annotations

import random
import types

from hypothesis import given, note, settings, strategies as st

from softnic.core.requester import Run
from softnic.driver.faults import FaultInjector, FaultModel
from softnic.driver.nic import NIC

DROPS = ["", "loss=0.01", "loss=0.3", "loss=1"]
MORE = ["loss=0.01,delay=1ms", "duplicate=0.1", "reorder=0.1/200us", "corrupt=0.1",
        "p_enter_bad=0.01,p_leave_bad=0.5,loss_bad=0.5", "rate=1e9"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DROPS), st.integers(0, 2**32 - 1),
       st.lists(st.integers(1, 70), min_size=1, max_size=8))
def test_apply_run_is_apply_of_each(spec, seed, runs):
    note(f"replay: {spec!r}, seed {seed}, runs {runs}")
    model = FaultModel.parse(spec)
    a = FaultInjector(model, random.Random(seed))
    b = FaultInjector(model, random.Random(seed))
    assert a.drops_only
    for n in runs:
        keep = a.apply_run(n, 1.0)
        each = [i for i in range(n) if b.apply(b"x%d" % i, 1.0)]
        assert keep == each
    assert a.counters == b.counters
    assert a.rng.getstate() == b.rng.getstate()


def test_a_model_that_does_more_than_drop_is_applied_one_by_one():
    for spec in MORE:
        inj = FaultInjector(FaultModel.parse(spec), random.Random(1))
        assert not inj.drops_only, spec
        assert inj.apply_run(5, 0.0) is None
        assert inj.counters["sent"] == 0


def _datagrams(items) -> list[tuple[bytes, tuple]]:
    out = []
    for item in items:
        if type(item) is not Run:
            out.append((bytes(item[0]), item[1]))
        else:
            buf, addr, seg, _ = item
            out += [(bytes(buf[o:o + seg]), addr) for o in range(0, len(buf), seg)]
    return out


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DROPS), st.integers(0, 2**32 - 1),
       st.lists(st.tuples(st.integers(1, 40), st.integers(0, 30)), min_size=1, max_size=6))
def test_a_nics_surviving_runs_are_the_datagrams_apply_lets_through(spec, seed, shape):
    """``NIC._surviving`` against ``apply`` of each datagram (what ``NIC._send``
    does for a capture or a model that does more): the same datagrams leave."""
    note(f"replay: {spec!r}, seed {seed}, shape {shape}")
    rng = random.Random(seed)
    out = []
    for n, tail in shape:            # a run of n datagrams of 64 bytes (the last shorter),
        seg = 64                     # or a lone datagram
        if n == 1:
            out.append((bytearray(rng.randbytes(20)), ("10.0.0.2", 4791)))
        else:
            out.append(Run(bytearray(rng.randbytes(seg * (n - 1) + 1 + tail)),
                           ("10.0.0.2", 4791), seg, n))
    model = FaultModel.parse(spec)
    a = types.SimpleNamespace(injector=FaultInjector(model, random.Random(seed)))
    b = FaultInjector(model, random.Random(seed))
    got = _datagrams(NIC._surviving(a, out, 2.0))
    want = [(bytes(copy), addr) for data, addr in _datagrams(out)
            for at, copy in b.apply(data, 2.0)]
    assert got == want
    assert a.injector.counters == b.counters
