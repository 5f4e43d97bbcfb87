"""Build softnic's librdmacm.so.1 with cffi's embedding mode.

    python -m softnic.faces.librdmacm.build [--out DIR] [--force]

Built as softnic's libibverbs.so.1 is (``softnic.faces.libibverbs.build``): the
interpreter building it runs inside the program that loads it, and it links
libibverbs.so.1, which ``softnic exec`` resolves to softnic's, so both libraries
share one interpreter, one engine and the same device contexts.  Builds are
built into softnic's libibverbs directory (``$XDG_CACHE_HOME/softnic/libibverbs/<key>``),
rebuilt there when its own sources change.

Needs a C compiler, Python's headers and rdma-core's ``<rdma/rdma_cma.h>``
(Debian: gcc, python3-dev, librdmacm-dev).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from .. import embedding as _e
from ..embedding import BuildError  # noqa: F401  (launch.py takes it from here)
from ..libibverbs import build as _ibv

HERE = Path(__file__).resolve().parent
SONAME = "librdmacm.so.1"
MODULE = "_softnic_librdmacm"
SOURCES = ("api.h", "callbacks.h", "shim.c", "rsocket.c", "symbols.txt", "build.py",
           "backend.py")
EMBED = _ibv.HERE / "embed.c"

LIBRARY = _e.Library(
    here=HERE, soname=SONAME, module=MODULE, backend="softnic.faces.librdmacm.backend",
    headers=("errno.h", "rdma/rdma_cma.h"), package="librdmacm-dev", embed_c=EMBED,
    failure="-1",               # -1 with errno EOPNOTSUPP, librdmacm's way
    libraries=("ibverbs",), command="softnic build-librdmacm", c_files=("shim.c", "rsocket.c"))
symbols, implemented, unimplemented = LIBRARY.symbols, LIBRARY.implemented, LIBRARY.unimplemented
version_script, stubs_c, wrappers_c = LIBRARY.version_script, LIBRARY.stubs_c, LIBRARY.wrappers_c
callbacks = LIBRARY.callbacks


def cache_key() -> str:
    return _e.cache_key([HERE / name for name in SOURCES] + [EMBED, Path(_e.__file__)])


def library_dir(out=None) -> Path:
    """Beside softnic's libibverbs.so.1 (one directory on LD_LIBRARY_PATH serves both;
    ``librdmacm.key`` there names the sources the library was built from)."""
    if out is not None:
        return Path(out)
    return _ibv.library_dir()


def build(out=None, force: bool = False, verbose: bool = False) -> Path:
    """Build (or find in the cache) the library; returns the directory holding it."""
    dest = library_dir(out)
    lib = dest / SONAME
    keyfile = dest / "librdmacm.key"
    key = cache_key()
    if lib.exists() and not force and keyfile.exists() and keyfile.read_text() == key:
        return dest
    LIBRARY.check_tools(dest)
    with tempfile.TemporaryDirectory(prefix="softnic-librdmacm-") as tmp:
        tmp_lib = LIBRARY.compile(dest, Path(tmp), verbose)
        os.replace(tmp_lib, lib)
        tmp_key = dest / f"librdmacm.key.{os.getpid()}.tmp"
        tmp_key.write_text(key)
        os.replace(tmp_key, keyfile)
    return dest


add_arguments = _e.add_arguments


def run(args) -> int:
    return LIBRARY.run(args, build)


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="softnic build-librdmacm",
                                 description="Build softnic's drop-in librdmacm.so.1.")
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
