"""softnic's compiled per-packet kernel (``kernel.c``), built with cffi.

The bulk data path spends its time in two loops: the sender building MIDDLE
packets (header, payload copy, ICRC) and the receiver checking and placing
them.  ``kernel.c`` runs those loops in C, a run of packets per call; the
engine (``softnic.core``) calls it through the ``kernel`` a device is given,
and keeps its Python loops for when there is none.  Both give the same bytes
and the same results (tests/test_kernel.py).

``load()`` builds the module on first use (a C compiler and Python's headers:
Debian's gcc and python3-dev) and caches it under
``$XDG_CACHE_HOME/softnic/kernel/<key>`` (``hostfiles.cache_home()``), the key
covering the source and the interpreter.  Without a compiler it returns None, and
softnic runs its Python loops.  ``SOFTNIC_KERNEL=0`` turns the kernel off.

The CRC-32 the kernel computes is ISA-L's (``crc32_gzip_refl``, from the
``isal`` package's extension module, the function ``isal.isal_zlib.crc32``
calls), else zlib's ``crc32`` from ``libz.so.1``, else a table of its own;
each is checked against ``zlib.crc32`` before it is used.

The same module carries the progress thread's sleep (``wait.c``, ``sn_wait``):
one ppoll(2) on a device's socket and doorbell without the interpreter lock,
which ``waiter()`` gives whatever ``SOFTNIC_KERNEL`` says (softnic.driver.nic falls
back to ``select.poll`` without it); and the UDP driver's gathered send
(``send.c``, ``sn_send_gather``): a run whose payload stays in registered memory
(``sn_tx_heads``) goes down as each packet's header, payload and ICRC, one
sendmsg(2) with GSO per 64 KiB, the payload copied once, by the kernel; its one
receive (``rx.c``, ``sn_rx_one``: the socket's ``recv_runs``, one recvmsg(2) and
its GRO segment size); and its
receive of a stream of a WRITE's MIDDLEs (``rx.c``, ``sn_rx_stream``): run after
run received and placed without the interpreter between them; its receive of a
QP's READ responses, READ after READ (``rx.c``, ``sn_rx_reads``, with ``kernel.c``'s
``sn_rx_edge`` and ``sn_rx_middles``); and its answer to a
peer's READs and ATOMICs (``rx.c``, ``sn_rx_answers``, with
``kernel.c``'s ``sn_read_only``, ``sn_read_run`` and ``sn_atomic_ack``): each
response sent as its request is taken (a READ's MIDDLEs gathered from memory by
``sn_send_gather``).

Beside it, a second module for the simulator (``fabric.c``, ``fabric_loop()``): the
event loop of ``softnic.transport.sim.Fabric.run`` over the fabric's own Python
objects, a CPython extension (it works on Python objects, which cffi does not
pass), built and cached the same way and turned off by the same variable.  The same
extension carries a device's timers (``timers.c``: ``softnic.core.timers.Timers``'
``arm``, ``get_timer`` and ``handle_timer`` over the device's QPs) and the common
case of its drain (``output.c``: ``Output.datagrams_to_send`` and ``_outgoing``),
which ``give_compiled(dev)`` makes the methods of a device's class in place of
the Python's: asked by the simulated fabric for its devices, and by a live NIC
where the kernel is loaded.  That drain calls ``requester.c`` for
``softnic.core.requester.generate``: a controlled RC QP's MIDDLEs (its pacer,
window, AckReq cadence, bytes and the controller's accounting) compiled, and an
uncontrolled one's runs where the driver gathers (a SEND from its FIRST to its
LAST, the heads by the kernel's ``sn_tx_heads``: ``bulk_runs``) and its requests
of one packet, every other case handed to the Python's.  ``give_compiled``
also makes ``responder.c`` the class's ``Dispatch._send_run``:
``responder.receive_send_run`` and ``took_send_run``, a SEND received in one
run, compiled around the kernel's ``sn_rx_send_run``; and its
``Dispatch._send_only``, ``responder.receive_edge`` of a SEND ONLY around
``sn_rx_edge``; and ``completer.c`` its ``Dispatch._ack`` and ``_answer``,
``completer.receive_common`` of a plain ACK and ``receive_answer_common`` of a
READ RESPONSE ONLY or an ATOMIC ACKNOWLEDGE, each packet checked (and a READ's
payload placed) by ``sn_rx_edge``.
``hook_kernel`` gives them the loaded kernel's functions.
And it carries the C face's post of send records (``post.c``, ``post_records``): ``backend._send_wr`` and
``Verbs.post_send`` for the common case, the rest left to them.

    python -m softnic.accel [-v]     # build both, check, say which CRC the kernel uses
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
import threading
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULE = "_softnic_kernel"
FABRIC_MODULE = "_softnic_fabric"
CRC_KINDS = {0: "table", 1: "isa-l", 2: "zlib"}

_loaded: object = None
_tried = False
_lock = threading.Lock()
#: why ``load()`` returned None (empty when it did not)
error = ""


class Kernel:
    """The loaded module: ``ffi`` and ``lib`` (the functions of kernel.h)."""

    def __init__(self, module):
        self.ffi = module.ffi
        self.lib = module.lib
        self.crc = "table"

    def __repr__(self) -> str:
        return f"<softnic kernel, CRC-32 by {self.crc}>"


def _sources_key(names, *extra: str) -> str:
    """A cache key: the sources ``names`` (in this directory), this interpreter and
    the compiler asked for, and ``extra``."""
    h = hashlib.sha256()
    for name in names:
        h.update((HERE / name).read_bytes())
    for part in (sys.version, sys.executable, sysconfig.get_config_var("EXT_SUFFIX") or "",
                 os.environ.get("CC", "cc"), *extra):
        h.update(part.encode())
    return h.hexdigest()[:16]


def _key() -> str:
    try:
        import cffi
        version = cffi.__version__
    except ImportError:
        version = ""
    return _sources_key(("bytes.h", "wire.h", "kernel.h", "kernel.c", "wait.h", "wait.c", "send.h",
                         "send.c", "rx.h", "rx.c", "__init__.py"), version)


def _fabric_key() -> str:
    """``_key`` for ``fabric.c``, ``timers.c``, ``output.c``, ``requester.c``, ``post.c``,
    ``responder.c`` and ``completer.c`` (no cffi in them: looking for the loop stays
    cheap)."""
    return _sources_key(("objects.h", "bytes.h", "fabric.c", "timers.c", "output.c",
                         "requester.c", "post.c", "responder.c", "completer.c",
                         "__init__.py"))


def _toolchain() -> tuple[str, str]:
    """(the C compiler's command, Python's include directory), or RuntimeError saying
    what to install."""
    import shutil
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc.split()[0]) is None:
        raise RuntimeError("no C compiler (Debian: gcc)")
    inc = sysconfig.get_paths().get("include")
    if not inc or not (Path(inc) / "Python.h").exists():
        raise RuntimeError(f"no Python.h in {inc} (Debian: python3-dev)")
    return cc, inc


def cache_dir() -> Path:
    from softnic.driver.hostfiles import cache_home
    return cache_home() / "kernel" / _key()


def fabric_dir() -> Path:
    """Where ``fabric.c``'s build for this interpreter is cached."""
    from softnic.driver.hostfiles import cache_home
    return cache_home() / "fabric" / _fabric_key()


def _target(dest: Path, module: str) -> Path:
    """The extension file of ``module`` built into ``dest``."""
    return dest / (module + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


def build(dest: Path, verbose: bool = False) -> Path:
    """Compile the module into ``dest``; returns the extension's path."""
    import shutil
    import tempfile

    import cffi
    target = _target(dest, MODULE)
    if target.exists():
        return target
    _toolchain()
    ffi = cffi.FFI()
    ffi.cdef((HERE / "kernel.h").read_text() + (HERE / "wait.h").read_text()
             + (HERE / "send.h").read_text() + (HERE / "rx.h").read_text())
    ffi.set_source(MODULE, "#include <stdint.h>\n#include <stddef.h>\n"
                   + (HERE / "bytes.h").read_text() + (HERE / "wire.h").read_text() + (HERE / "kernel.h").read_text()
                   + (HERE / "wait.c").read_text() + (HERE / "send.c").read_text()
                   + (HERE / "rx.c").read_text() + (HERE / "kernel.c").read_text(),
                   extra_compile_args=["-O2", "-fvisibility=hidden"])
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="softnic-kernel-") as tmp:
        built = Path(ffi.compile(tmpdir=tmp, verbose=verbose))
        fd, part = tempfile.mkstemp(dir=dest, prefix=target.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f, open(built, "rb") as src:
                shutil.copyfileobj(src, f)
            os.replace(part, target)    # atomic: two processes may build at once
        except BaseException:
            os.unlink(part)
            raise
    return target


def build_fabric(dest: Path, verbose: bool = False) -> Path:
    """Compile ``fabric.c``, ``timers.c``, ``output.c``, ``requester.c``, ``post.c``,
    ``responder.c`` and ``completer.c`` into ``dest``; returns the extension's path."""
    target = _target(dest, FABRIC_MODULE)
    if target.exists():
        return target
    import subprocess
    import tempfile
    cc, inc = _toolchain()
    dest.mkdir(parents=True, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=dest, prefix=target.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        cmd = cc.split() + ["-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-I", inc,
                            str(HERE / "fabric.c"), str(HERE / "timers.c"), str(HERE / "output.c"),
                            str(HERE / "requester.c"), str(HERE / "post.c"),
                            str(HERE / "responder.c"), str(HERE / "completer.c"), "-o", part]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if verbose or r.returncode:
            sys.stderr.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
        if r.returncode:
            raise RuntimeError(f"{cc} failed on fabric.c: {r.stderr.strip()[-400:]}")
        os.replace(part, target)        # atomic: two processes may build at once
    except BaseException:
        if os.path.exists(part):
            os.unlink(part)
        raise
    return target


def cached() -> dict[str, Path | None]:
    """The builds this interpreter would load, if they are in the cache already:
    ``{"kernel": path or None, "fabric": path or None}``.  Builds nothing (``softnic
    doctor --no-live``)."""
    kernel = _target(cache_dir(), MODULE)
    fabric = _target(fabric_dir(), FABRIC_MODULE)
    return {"kernel": kernel if kernel.exists() else None,
            "fabric": fabric if fabric.exists() else None}


_fabric: object = None
_fabric_tried = False
#: why ``fabric_loop()`` returned None (empty when it did not)
fabric_error = ""


def fabric_loop(verbose: bool = False):
    """The simulator's compiled event loop (``fabric.c``, built and cached on first
    use), or None if it cannot be had here or ``SOFTNIC_KERNEL=0``;
    ``fabric_error`` then says why."""
    global _fabric, _fabric_tried, fabric_error
    if os.environ.get("SOFTNIC_KERNEL", "1").strip().lower() in ("0", "no", "off", "false"):
        fabric_error = "turned off by SOFTNIC_KERNEL"
        return None
    with _lock:
        if not _fabric_tried:
            _fabric_tried = True
            try:
                _fabric = _import(build_fabric(fabric_dir(), verbose=verbose), FABRIC_MODULE)
            except Exception as e:       # no compiler, no headers, a failed build: Python's loop
                fabric_error = f"{type(e).__name__}: {e}"
        return _fabric


#: the device classes given compiled methods (``give_compiled``), each with their names
_compiled_classes: dict = {}
_TIMERS = ("arm", "get_timer", "handle_timer")          # Timers'
_DRAIN = ("datagrams_to_send", "_outgoing")             # Output's
_RECEIVE = ("_send_run", "_send_only", "_ack", "_answer")     # Dispatch's


def give_compiled(dev) -> bool:
    """Make the timers of ``dev``'s class, its drain and its receive of a SEND's run
    the compiled ones (``timers.c``: ``arm``, ``get_timer`` and ``handle_timer`` of
    ``softnic.core.timers.Timers``; ``output.c``: ``datagrams_to_send`` and
    ``_outgoing`` of ``softnic.core.output.Output``; ``responder.c``: ``_send_run``
    and ``_send_only`` of ``softnic.core.dispatch.Dispatch``; the same rules) in place of the
    Python's, if the module beside the simulator's loop can be had here
    (``fabric_loop()``) and the class runs the Python's own timers (an iWARP
    device, whose timers are its own, keeps them; the drain goes with the timers,
    where the class's is ``Output``'s).  For the class, not the one device: every
    device of it (and of its subclasses) runs them from then on, each from its
    next call.  A driver or fabric asks, as it gives the kernel.  Returns whether
    the class has them."""
    from softnic.core import completer, output, requester, responder
    from softnic.core.dispatch import Dispatch
    from softnic.core.output import Output
    from softnic.core.timers import Timers
    cls = type(dev)
    kernel = getattr(dev, "kernel", None)
    for given, names in tuple(_compiled_classes.items()):
        if issubclass(cls, given):      # (a subclass may override some)
            m = fabric_loop()
            if kernel is not None and m is not None:
                hook_kernel(m, kernel)
            return all(getattr(cls, n) is getattr(given, n) for n in names)
    m = fabric_loop()
    if m is None:
        return False
    if any(getattr(cls, n, None) is not getattr(Timers, n) for n in _TIMERS + ("_arm_ready",)):
        return False
    names = _TIMERS
    if all(getattr(cls, n, None) is getattr(Output, n) for n in _DRAIN):
        names += _DRAIN
    if all(getattr(cls, n, None) is getattr(Dispatch, n) for n in _RECEIVE):
        names += _RECEIVE
    with _lock:
        methods = m.device_methods(cls, completer, requester, output)
        m.responder_setup(responder, None, 0, 0)
        for name in names:
            setattr(cls, name, methods[name])
        _compiled_classes[cls] = names
    if kernel is not None:
        hook_kernel(m, kernel)
    return True


def hook_kernel(m, kernel) -> None:
    """Give the compiled requester (``m``, ``fabric_loop()``) the loaded kernel's
    ``sn_tx_heads`` and ``sn_crc32``, which it builds a gathered run with
    (``requester.c``'s ``bulk_runs``), and the compiled receive its
    ``sn_rx_send_run`` and ``sn_rx_edge`` (``responder.c``), for the devices whose ``kernel`` is
    ``kernel``; any other device (none, a test's wrapper of it) keeps the Python's
    runs."""
    from softnic.core import responder
    ffi, lib = kernel.ffi, kernel.lib

    def address(name: str) -> int:
        return int(ffi.cast("uintptr_t", ffi.addressof(lib, name)))
    m.kernel_hooks(kernel, address("sn_tx_heads"), address("sn_crc32"))
    m.responder_setup(responder, kernel, address("sn_rx_send_run"), address("sn_rx_edge"))


def _import(path: Path, name: str = MODULE):
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _crc_candidates():
    """(address, kind) of CRC-32 functions to try, best first."""
    import ctypes
    import ctypes.util
    try:
        from isal import isal_zlib
        f = ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl
        yield ctypes.cast(f, ctypes.c_void_p).value, 1
    except (ImportError, OSError, AttributeError):
        pass
    name = ctypes.util.find_library("z") or "libz.so.1"
    try:
        f = ctypes.CDLL(name).crc32
        yield ctypes.cast(f, ctypes.c_void_p).value, 2
    except (OSError, AttributeError):
        pass
    yield 0, 0


def _choose_crc(k: Kernel) -> None:
    samples = [bytes(range(256)) * 17, b"", b"\x00", os.urandom(4109)]
    for addr, kind in _crc_candidates():
        k.lib.sn_set_crc(addr or 0, kind)
        ok = all(k.lib.sn_crc32(seed, k.ffi.from_buffer(s), len(s)) == zlib.crc32(s, seed)
                 for s in samples for seed in (0, 0x12345678, 0xFFFFFFFF))
        if ok:
            k.crc = CRC_KINDS[kind]
            return
    raise RuntimeError("no CRC-32 agrees with zlib's")


def waiter():
    """The loaded module for ``lib.sn_wait`` (the progress thread's sleep), whatever
    ``SOFTNIC_KERNEL`` says; None where it cannot be built."""
    k = _load()
    return k


def load(verbose: bool = False):
    """The kernel (built and cached on first use), or None if it cannot be had
    here or ``SOFTNIC_KERNEL=0``; ``error`` then says why."""
    global error
    if os.environ.get("SOFTNIC_KERNEL", "1").strip().lower() in ("0", "no", "off", "false"):
        error = "turned off by SOFTNIC_KERNEL"
        return None
    k = _load(verbose)
    if k is None:
        error = _error
    return k


_error = ""


def _load(verbose: bool = False):
    global _loaded, _tried, _error
    with _lock:                      # (NICs may be opened from several threads)
        if _tried:
            return _loaded
        _tried = True
        try:
            k = Kernel(_import(build(cache_dir(), verbose=verbose)))
            _choose_crc(k)
        except Exception as e:       # no compiler, no headers, a failed build: Python loops
            _error = f"{type(e).__name__}: {e}"
            return None
        _loaded = k
        return k


def describe() -> str:
    """One line for reports: which per-packet loops run."""
    k = load()
    if k is None:
        return f"python ({error})" if error else "python"
    return f"cffi kernel, CRC-32 by {k.crc}"


def main() -> int:
    k = load(verbose="-v" in sys.argv[1:])
    if k is None:
        print(f"no kernel: {error}", file=sys.stderr)
        return 1
    print(f"{describe()}: {cache_dir()}")
    if fabric_loop(verbose="-v" in sys.argv[1:]) is None:
        print(f"no compiled fabric loop: {fabric_error}", file=sys.stderr)
        return 1
    print("the simulator's event loop: compiled")
    return 0
