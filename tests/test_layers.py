"""The layers README.md's table names, and no import cycles (tools/import_graph.py)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import import_graph as ig  # noqa: E402


def test_importing_the_engine_loads_no_other_layer():
    # ``import softnic.core``, then every module of core and wire, in a fresh interpreter
    prog = textwrap.dedent("""
        import importlib, json, pkgutil, sys
        import softnic.core, softnic.wire
        for pkg in (softnic.core, softnic.wire):
            for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
                importlib.import_module(m.name)
        print(json.dumps(sorted(m for m in sys.modules
                                if m.split(".")[0] in ("softnic", "verbs_api", "congestion"))))
        """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout)
    assert "softnic.core.device" in loaded
    engine = ig.LAYERS[0][1]
    others = [m for m in loaded
              if m != "softnic" and not any(m == p or m.startswith(p + ".") for p in engine)]
    assert others == [], f"import softnic.core loads {others}"


def test_no_import_cycles():
    mods = ig.modules()
    assert "verbs_api.qp" in mods and "softnic.core.device" in mods
    assert ig.cycles(ig.graph(mods)) == []


def test_every_module_is_in_a_layer_and_imports_no_later_one():
    mods = ig.modules()
    edges = ig.graph(mods)
    assert ig.unplaced(mods) == []
    assert ig.layer_breaks(edges) == []


def test_the_command_is_the_top_layer_and_nothing_imports_it():
    # softnic/cli/ holds the command only: no module outside it (libraries, the
    # testing plugin) reaches into it
    assert ig.LAYERS[-1] == ("tools", ("softnic.cli",))
    edges = ig.graph(ig.modules())
    into_cli = sorted((src, dst) for src, dsts in edges.items() for dst in dsts
                      if ig.layer_of(dst) == len(ig.LAYERS) - 1
                      and ig.layer_of(src) != len(ig.LAYERS) - 1)
    assert into_cli == []


def _tree(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return ig.modules(tmp_path, ("pkg",))


def test_the_checks_see_a_cycle_through_a_deferred_import_and_a_layer_break(tmp_path):
    mods = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "from . import b\n",
        "pkg/low/b.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg.high import c      # not a cycle: never runs
            def f():
                from .a import thing        # a cycle, deferred or not
                import pkg.high.c           # a layer break
            """,
        "pkg/high/__init__.py": "",
        "pkg/high/c.py": "from ..low import b\n",
    })
    edges = ig.graph(mods)
    assert edges["pkg.low.a"] == {"pkg.low.b"}
    assert edges["pkg.low.b"] == {"pkg.low.a", "pkg.high.c"}
    assert ig.cycles(edges) == [["pkg.high.c", "pkg.low.a", "pkg.low.b"]]
    layers = (("low", ("pkg.low",)), ("high", ("pkg.high",)))
    assert ig.layer_breaks(edges, layers) == [("pkg.low.b", "pkg.high.c")]
    assert ig.unplaced(mods, layers, roots=("pkg",)) == []
    assert ig.unplaced(mods, layers[:1], roots=("pkg",)) == ["pkg.high", "pkg.high.c"]


def test_a_parent_files_its_children_by_kind_as_isinstance_would():
    from verbs_api.base import kinds
    from verbs_api.cq import CQ, CQEX
    from verbs_api.mr import DMMR
    from verbs_api.pd import PD, ParentDomain
    from verbs_api.qp import QPEx
    from verbs_api.pyverbs_error import PyverbsError

    def bare(cls):                  # an instance without a device behind it
        obj = cls.__new__(cls)
        obj._closed = True
        return obj

    assert kinds(bare(ParentDomain)) == {"ParentDomain", "PD"}
    assert kinds(bare(QPEx)) == {"QP"} and kinds(bare(DMMR)) == {"MR"}
    assert kinds(bare(CQEX)) == {"CQEX"} and kinds(bare(CQ)) == {"CQ"}
    pd = bare(PD)
    pd.mrs, pd.qps = set(), set()
    mr, qp = bare(DMMR), bare(QPEx)
    pd.add_ref(mr)
    pd.add_ref(qp)
    assert pd.mrs == {mr} and pd.qps == {qp}
    try:
        pd.add_ref(bare(CQEX))            # a CQ belongs to a parent domain, not a PD
    except PyverbsError as ex:
        assert "Unrecognized" in str(ex)
    else:
        raise AssertionError("PD.add_ref took a CQEX")
    dom = bare(ParentDomain)
    dom.cqs = set()
    cq = bare(CQEX)
    dom.add_ref(cq)
    assert dom.cqs == {cq}


def test_no_layer_uses_another_layers_private_names():
    # a layer reaches the next through its public surface (tools/import_graph.py
    # --private lists what modules of one layer still share)
    across = [(user, owner, sorted(names))
              for (user, owner), names in ig.private_crossings(ig.modules()).items()
              if {ig.layer_of(o) for o in owner.split(" or ")} != {ig.layer_of(user)}]
    assert across == []


def test_the_private_check_sees_reads_of_other_modules_private_names(tmp_path):
    mods = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/engine.py": """
            class Device:
                def __init__(self):
                    self._ready = {}
                    self.cq = None
                def _wait(self):
                    return self._ready          # its own: not counted
            def _take(dev):
                return dev._ready               # its own class's attribute
            """,
        "pkg/high/__init__.py": "",
        "pkg/high/driver.py": """
            import sys
            from pkg.low import engine as eng
            from pkg.low.engine import _take
            class Nic:
                def __init__(self, dev):
                    self._wait = None
                    self.dev = dev
                def step(self):
                    eng._take(self.dev)             # a private function of a module
                    if hasattr(self.dev, "_ready"):  # by name
                        self._wait = self.dev._wait  # held by self: the engine's
                    return sys._getframe()          # a library's: not counted
            """,
    })
    found = ig.private_crossings(mods, (("low", ("pkg.low",)), ("high", ("pkg.high",))))
    assert found == {("pkg.high.driver", "pkg.low.engine"): {
        "_take": [4, 10], "_ready": [11], "_wait": [12]}}
