"""Shared test setup.

Hypothesis profiles:
  dev   local default: like Hypothesis's default, but every failure also
        prints the @reproduce_failure(...) line that replays it.
  ci    Hypothesis's built-in profile, loaded by itself when CI is set
        (derandomized, no example database, prints the replay line), with
        300 examples per property.
  deep  long property runs, 100 000 examples: pytest --hypothesis-profile=deep
"""

from hypothesis import settings

settings.register_profile("dev", print_blob=True)
settings.register_profile("deep", max_examples=100_000, deadline=None, print_blob=True)
settings.register_profile("ci", settings.get_profile("ci"), max_examples=300)
if settings.get_current_profile_name() == "default":
    settings.load_profile("dev")
elif settings.get_current_profile_name() == "ci":
    settings.load_profile("ci")


import os  # noqa: E402

import pytest  # noqa: E402


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a test never skips: a skip (a tool, a compiler or a package
    missing: .ci/run installs them all) is reported as a failure, with its
    reason.  Elsewhere a skip stays a skip."""
    report = yield
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every test must run: {reason}"
    return report


@pytest.fixture(scope="module")
def compiled_with_kernel():
    """The compiled fabric module (``softnic.accel.fabric_loop()``) set up as
    ``give_compiled`` sets it up, the loaded kernel hooked in (``hook_kernel``): what
    the differential tests of ``requester.c``'s runs and ``responder.c``'s receive
    run against the Python.  Fails under CI where either cannot be had (a skip
    elsewhere)."""
    from softnic import accel
    from softnic.core import completer, output, requester
    from softnic.core.device import Device
    m = accel.fabric_loop()
    kernel = accel.load()
    if m is None or kernel is None:
        reason = accel.fabric_error or accel.error or "not built"
        if os.environ.get("CI") == "true":
            pytest.fail(f"no compiled module or kernel under CI: {reason}")
        pytest.skip(f"no compiled module or kernel here: {reason}")
    m.device_methods(Device, completer, requester, output)
    accel.hook_kernel(m, kernel)
    return m


@pytest.fixture
def record_calls(monkeypatch):
    """``record_calls(module, names)``: each function named, in ``module``, put back
    by one that records its name in the list returned and calls it (the
    differential tests' proof that a compiled path did not call the Python's
    functions it stands for)."""
    def record(module, names) -> list:
        called: list = []
        for name in names:
            real = getattr(module, name)
            monkeypatch.setattr(module, name,
                                lambda *a, _n=name, _r=real: (called.append(_n), _r(*a))[1])
        return called
    return record
