"""Which faces this machine can offer, and what to install for the others.

    >>> from softnic.faces.availability import face_status
    >>> face_status()["librdmacm"]
    FaceStatus(ok=False, reason='<rdma/rdma_cma.h> is missing', install='apt-get install -y librdmacm-dev')

Each face stands on its own: the Python face (``pyverbs``: softnic's ``verbs_api``)
needs nothing beyond softnic's own dependencies; the C face ``libibverbs`` (the drop-in
libibverbs.so.1) needs a C compiler, Python's headers and rdma-core's
``<infiniband/verbs.h>``; ``librdmacm`` needs all of that and ``<rdma/rdma_cma.h>``.
The answers come from the same checks the builds make (``embedding.Library.missing``);
nothing is built here.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["FACES", "FaceStatus", "face_status"]

#: The faces, in the order a program meets them.
FACES = ("pyverbs", "libibverbs", "librdmacm")


class FaceStatus(NamedTuple):
    ok: bool            # the face can be built and offered here
    reason: str         # what is missing ("" when ok)
    install: str        # the command that installs it, Debian's ("" when ok)


def _status(lacks: list[tuple[str, str]]) -> FaceStatus:
    if not lacks:
        return FaceStatus(True, "", "")
    packages = " ".join(dict.fromkeys(pkg for _, pkg in lacks))
    return FaceStatus(False, "; ".join(what for what, _ in lacks),
                      f"apt-get install -y {packages}")


def face_status() -> dict[str, FaceStatus]:
    """Each face of ``FACES``: whether it can be built here and, if not, why and the
    command that installs what it lacks."""
    from .libibverbs.build import LIBRARY as IBV
    from .librdmacm.build import LIBRARY as RDMACM
    ibv = IBV.missing()
    # librdmacm.so.1 links libibverbs.so.1 and is loaded beside softnic's
    rdmacm = RDMACM.missing() + [m for m in ibv if m not in RDMACM.missing()]
    return {"pyverbs": FaceStatus(True, "", ""), "libibverbs": _status(ibv),
            "librdmacm": _status(rdmacm)}
