"""Build softnic's libibverbs.so.1 with cffi's embedding mode.

    softnic build-libibverbs [--out DIR] [--force]

The library runs this interpreter (the one building it) inside the C program
that loads it: its path, the project's directory and this environment's
site-packages are baked in, so a program needs only ``LD_LIBRARY_PATH``
(``softnic exec`` sets it).  Builds are cached under
``$XDG_CACHE_HOME/softnic/libibverbs/<key>`` (``hostfiles.cache_home()``: a user
without a writable home gets a private directory in /tmp instead), the key covering
the sources, the interpreter and the project location.

Needs a C compiler, Python's headers and rdma-core's ``<infiniband/verbs.h>``
(Debian: gcc, python3-dev, libibverbs-dev).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from .. import embedding as _e
from ..embedding import BuildError

HERE = Path(__file__).resolve().parent
SONAME = "libibverbs.so.1"
PRELOAD = "libsoftnic_preload.so"
MODULE = "_softnic_libibverbs"
SOURCES = ("api.h", "callbacks.h", "embed.c", "preload.c", "shim.c", "symbols.txt", "build.py", "backend.py")

LIBRARY = _e.Library(
    here=HERE, soname=SONAME, module=MODULE, backend="softnic.faces.libibverbs.backend",
    headers=("infiniband/verbs.h",), package="libibverbs-dev", embed_c=HERE / "embed.c",
    failure="EOPNOTSUPP",       # an int entry point returns the errno, libibverbs' way
    # What a call answers in a child of a process that had started softnic (its devices,
    # threads and sockets stayed in the parent): no devices, -EIO from a poll, else EIO.
    fork_answer=(("sn_device_count", "0"), ("sn_poll_cq", "-EIO")),
    command="softnic build-libibverbs")
symbols, implemented, unimplemented = LIBRARY.symbols, LIBRARY.implemented, LIBRARY.unimplemented
version_script, stubs_c, wrappers_c = LIBRARY.version_script, LIBRARY.stubs_c, LIBRARY.wrappers_c
callbacks = LIBRARY.callbacks


def cache_key() -> str:
    return _e.cache_key([HERE / name for name in SOURCES] + [Path(_e.__file__)])


def cache_root() -> Path:
    from softnic.driver.hostfiles import cache_home
    return cache_home() / "libibverbs"


def library_dir(out: str | os.PathLike | None = None) -> Path:
    return Path(out) if out is not None else cache_root() / cache_key()


def build(out: str | os.PathLike | None = None, force: bool = False,
          verbose: bool = False) -> Path:
    """Build (or find in the cache) the library; returns the directory holding it."""
    dest = library_dir(out)
    lib = dest / SONAME
    if lib.exists() and (dest / PRELOAD).exists() and not force:
        return dest
    LIBRARY.check_tools(dest)
    with tempfile.TemporaryDirectory(prefix="softnic-libibverbs-") as tmp:
        tmpdir = Path(tmp)
        tmp_lib = LIBRARY.compile(dest, tmpdir, verbose)
        try:
            _build_preload(dest, tmpdir, verbose)
        except BuildError:
            tmp_lib.unlink(missing_ok=True)
            raise
        os.replace(tmp_lib, lib)
    return dest


def _build_preload(dest: Path, tmpdir: Path, verbose: bool) -> None:
    """libsoftnic_preload.so (preload.c): plain C, no Python."""
    import subprocess
    out = tmpdir / PRELOAD
    cmd = [os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-fvisibility=hidden",
           "-o", str(out), str(HERE / "preload.c"), "-ldl"]
    if verbose:
        print(" ".join(cmd))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"building {PRELOAD} failed: {e}") from None
    if r.returncode:
        raise BuildError(f"building {PRELOAD} failed: {r.stderr.strip()}")
    tmp = dest / f"{PRELOAD}.{os.getpid()}.tmp"
    shutil.copyfile(out, tmp)
    os.replace(tmp, dest / PRELOAD)


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="softnic build-libibverbs",
                                 description="Build softnic's drop-in libibverbs.so.1.")
    add_arguments(ap)
    return run(ap.parse_args(argv))


add_arguments = _e.add_arguments


def run(args) -> int:
    return LIBRARY.run(args, build)


if __name__ == "__main__":
    sys.exit(main())
