"""face_status(): each face offered on its own, from the same checks the builds make.

A missing header is simulated by pointing the build at an include directory
(SOFTNIC_RDMA_INCLUDE) that lacks it; no package is uninstalled.
"""

from __future__ import annotations

import pytest

from softnic.faces.availability import FACES, face_status
from softnic.faces.embedding import INCLUDE_ENV, BuildError
from softnic.faces.libibverbs.build import LIBRARY as IBV
from softnic.faces.librdmacm.build import LIBRARY as RDMACM


@pytest.fixture
def include(tmp_path, monkeypatch):
    """An include directory holding only the headers a test gives it."""
    def make(*headers):
        for h in headers:
            (tmp_path / h).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / h).write_text("/* empty */\n")
        monkeypatch.setenv(INCLUDE_ENV, str(tmp_path))
        return tmp_path
    return make


def test_every_face_is_named():
    assert tuple(face_status()) == FACES


def test_missing_rdma_cma_h_costs_librdmacm_only(include):
    include("infiniband/verbs.h")
    st = face_status()
    assert st["pyverbs"].ok
    assert "verbs.h" not in st["libibverbs"].reason
    assert not st["librdmacm"].ok
    assert "<rdma/rdma_cma.h> is missing" in st["librdmacm"].reason
    assert "librdmacm-dev" in st["librdmacm"].install
    assert "libibverbs-dev" not in st["librdmacm"].install


def test_missing_verbs_h_costs_the_c_faces_not_the_python_face(include):
    include("rdma/rdma_cma.h")
    st = face_status()
    assert st["pyverbs"] == (True, "", "")
    for face in ("libibverbs", "librdmacm"):
        assert not st[face].ok
        assert "<infiniband/verbs.h> is missing" in st[face].reason
        assert "libibverbs-dev" in st[face].install


def test_a_missing_compiler_is_named(include, monkeypatch):
    include("infiniband/verbs.h", "rdma/rdma_cma.h")
    monkeypatch.setenv("CC", "softnic-no-such-compiler")
    st = face_status()
    for face in ("libibverbs", "librdmacm"):
        assert "no C compiler" in st[face].reason and "gcc" in st[face].install
    assert st["pyverbs"].ok


def test_the_build_refuses_with_the_same_words(include, tmp_path):
    include("infiniband/verbs.h")
    with pytest.raises(BuildError, match=r"<rdma/rdma_cma.h> is missing.*install librdmacm-dev"):
        RDMACM.check_tools(tmp_path / "out")
    if not face_status()["libibverbs"].ok:      # no compiler or Python.h here
        return
    IBV.check_tools(tmp_path / "out")
