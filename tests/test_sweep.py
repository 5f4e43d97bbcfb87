"""softnic experiment sweep: grids, resuming, intervals, and Dask runs (a 2-worker
LocalCluster, and a scheduler and two workers as separate processes on loopback)
whose result files are byte for byte a serial run's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from softnic.cli import main
from softnic.cli import sweep as sw

# tiny points (tens of ms of CPU each): what matters is where they run, not their size
INCAST = ["-e", "incast", "-p", "cc=dcqcn+hpcc", "-p", "senders=3", "-p", "duration=300us",
          "--seeds", "1,2"]
LOSS = ["-e", "loss", "-p", "loss=0,0.02", "-p", "selective_repeat=false,true",
        "-p", "total=512KiB", "-p", "msg=128KiB", "--seeds", "1-2"]
CLUSTER = ["-e", "cluster", "-p", "hosts=4", "-p", "hosts_per_leaf=2", "-p", "size=32KiB",
           "-p", "qps=1,2", "-p", "mode=lossy", "--seeds", "1,2"]
GRIDS = {"incast": INCAST, "loss": LOSS, "cluster": CLUSTER}

#: the scheduler's and the workers' loopback address (no other test uses 127.38/16)
SCHED_HOST = "127.38.0.1"


def _sweep(out: Path, grid: list[str], *extra: str) -> int:
    return main(["experiment", "sweep", *grid, "--out", str(out), "--no-progress", *extra])


def _files(out: Path) -> dict[str, bytes]:
    """Everything a sweep's results are: the point files and the three outputs."""
    got = {f"points/{p.name}": p.read_bytes() for p in sorted((out / "points").iterdir())}
    for name in ("sweep.json", "sweep.csv", "sweep.png"):
        got[name] = (out / name).read_bytes()
    return got


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """Each grid run serially, in this process: the reference."""
    base = tmp_path_factory.mktemp("serial")
    for name, grid in GRIDS.items():
        assert _sweep(base / name, grid, "--serial") == 0
    return base


# ---------------------------------------------------------------- grids


def test_grid_from_file_and_options(tmp_path):
    f = tmp_path / "g.toml"
    f.write_text('experiment = "incast"\nseeds = "1-3"\n[params]\n'
                 'duration = "2ms"\nmsg = "64KiB"\ncc = ["dcqcn", "hpcc:eta=0.9"]\n'
                 'senders = [4, 8]\npfc = true\n')
    g = sw.build_grid(experiment=None, file=str(f), params=["senders=2,4,6", "rate_gbps=100"],
                      seeds=None)
    assert g.experiment == "incast" and g.seeds == [1, 2, 3]
    assert g.fixed == {"duration": 0.002, "msg": 65536, "pfc": True, "rate_gbps": 100.0}
    assert g.axes == {"cc": ["dcqcn", "hpcc:eta=0.9"], "senders": [2, 4, 6]}
    pts = g.points()
    assert len(pts) == 2 * 3 * 3
    # axes in order, seeds innermost; every parameter, defaults too
    assert [(p["cc"], p["senders"], p["seed"]) for p in pts[:4]] == [
        ("dcqcn", 2, 1), ("dcqcn", 2, 2), ("dcqcn", 2, 3), ("dcqcn", 4, 1)]
    assert pts[0]["mtu"] == 4096 and pts[0]["duration"] == 0.002
    late = sw.build_grid(experiment="incast", file=None, seeds=None,
                         params=["late_join=none,1ms", "int_telemetry=none"])
    assert late.axes == {"late_join": [None, 0.001]} and late.fixed == {"int_telemetry": None}
    assert len({sw.point_key("incast", p) for p in pts}) == len(pts)


@pytest.mark.parametrize("kw, msg", [
    (dict(params=["senderz=4"]), "no parameter 'senderz'"),
    (dict(params=["seed=1,2"]), "--seeds"),
    (dict(params=["senders=four"]), "senders"),
    (dict(params=["duration=2parsecs"]), "duration"),
    (dict(params=["pfc=maybe"]), "true or false"),
    (dict(params=["senders=4,4"]), "twice"),
    (dict(params=["senders"]), "NAME=VALUE"),
    (dict(params=["senders=none"]), "not none"),
    (dict(seeds="1,1"), "twice"),
    (dict(seeds="x"), "not a seed"),
    (dict(params=["mode=lossier"]), "mode must be lossy or lossless"),
    (dict(experiment="loss", params=["total=512KiB"]), "at least one msg"),
])
def test_bad_grid_is_a_clear_error(kw, msg):
    experiment = "cluster" if "mode" in str(kw) else "incast"
    args = {**dict(experiment=experiment, file=None, params=[], seeds=None), **kw}
    assert args["experiment"] in ("incast", "loss", "cluster")
    with pytest.raises(ValueError, match=msg):
        sw.build_grid(**args)


def test_bad_grid_exits_2(tmp_path, capsys):
    f = tmp_path / "g.toml"
    f.write_text('experiment = "incast"\n[params]\nsenders = [4\n')
    assert _sweep(tmp_path / "o", [str(f)]) == 2
    assert "g.toml" in capsys.readouterr().err
    assert main(["experiment", "sweep", "-p", "senders=4", "--out", str(tmp_path)]) == 2
    assert "name the experiment" in capsys.readouterr().err


def test_t_interval_matches_the_t_table():
    mean, sd, lo, hi = sw._t_interval([1.0, 2.0, 3.0])
    # t(0.975, 2 degrees of freedom) = 4.303 (any t-table); sd 1, n 3
    assert mean == 2.0 and sd == 1.0
    assert hi - mean == pytest.approx(4.303 / 3 ** 0.5, rel=1e-3)
    assert mean - lo == pytest.approx(hi - mean)
    assert sw._t_interval([5.0]) == (5.0, 0.0, None, None)
    assert sw._t_interval([2.0, 2.0])[2:] == (2.0, 2.0)


# ---------------------------------------------------------------- runs


def test_serial_results_and_resume(serial, tmp_path, capsys):
    res = json.loads((serial / "loss" / "sweep.json").read_text())
    assert res["axes"] == {"loss": [0.0, 0.02], "selective_repeat": [False, True]}
    assert res["missing_points"] == 0 and len(res["points"]) == 4
    lossy_gbn = res["points"][2]
    assert lossy_gbn["point"] == {"loss": 0.02, "selective_repeat": False}
    g = lossy_gbn["figures"]["goodput_gbps"]
    per_seed = [lossy_gbn["seeds"][s]["goodput_gbps"] for s in ("1", "2")]
    assert g["n"] == 2 and g["mean"] == pytest.approx(sum(per_seed) / 2)
    assert g["ci95"][0] <= min(per_seed) and g["ci95"][1] >= max(per_seed)
    assert "wall_s" not in lossy_gbn["seeds"]["1"]           # costs are kept apart
    csv = (serial / "loss" / "sweep.csv").read_text().splitlines()
    assert csv[0] == "loss,selective_repeat,figure,n,mean,sd,ci95_low,ci95_high"
    assert any(r.startswith("0.02,False,goodput_gbps,2,") for r in csv)
    assert (serial / "loss" / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    costs = sorted((serial / "loss" / "costs").iterdir())
    assert len(costs) == 8 and json.loads(costs[0].read_text())["cpu_s"] > 0

    # a stopped sweep: two points' files gone; the rerun runs those two alone
    out = tmp_path / "resumed"
    shutil.copytree(serial / "loss", out)
    gone = sorted((out / "points").iterdir())[:2]
    for p in gone:
        p.unlink()
    (out / "points" / (gone[1].name + ".part")).write_text("{half a po")
    capsys.readouterr()
    assert _sweep(out, LOSS, "--serial") == 0
    assert "2 point(s) run, 6 already in" in capsys.readouterr().out
    assert _files(out) == _files(serial / "loss")


def test_a_point_depends_on_its_parameters_alone():
    """The same point after others in one process gives the same figures."""
    a = dict(sw.build_grid(experiment="cluster", file=None, seeds="3",
                           params=["hosts=4", "hosts_per_leaf=2", "size=32KiB", "qps=2",
                                   "mode=lossy"]).points()[0])
    b = dict(a, qps=1, seed=1, collective="alltoall")
    first, _ = sw.run_point("cluster", a)
    sw.run_point("cluster", b)
    again, cost = sw.run_point("cluster", a)
    assert first == again and first["finished"]
    assert "wall_s" not in first and cost["wall_s"] > 0


def test_local_cluster_matches_serial(serial, tmp_path):
    out = tmp_path / "local"
    assert _sweep(out, INCAST, "--workers", "2") == 0
    assert _files(out) == _files(serial / "incast")
    workers = {json.loads(p.read_text())["worker"] for p in (out / "costs").iterdir()}
    assert all(w and w.startswith("tcp://") for w in workers)


def _start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), start_new_session=True)


def test_scheduler_and_workers_as_processes_match_serial(serial, tmp_path):
    """A real deployment on loopback: ``dask scheduler`` and two ``dask worker``
    processes, the sweep a client of them."""
    sched_file = tmp_path / "scheduler.json"
    procs = [_start(["distributed.cli.dask_scheduler", "--host", SCHED_HOST, "--port", "0",
                     "--no-dashboard", "--scheduler-file", str(sched_file)],
                    tmp_path / "scheduler.log")]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "the scheduler did not start in 60 s"
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        assert address.startswith(f"tcp://{SCHED_HOST}:")
        for i in range(2):
            procs.append(_start(["distributed.cli.dask_worker", address, "--nthreads", "1",
                                 "--host", SCHED_HOST, "--no-dashboard", "--no-nanny",
                                 "--name", f"w{i}"], tmp_path / f"worker{i}.log"))
        from distributed import Client
        with Client(address, timeout=60) as c:
            c.wait_for_workers(2, timeout=60)
        for name in ("incast", "cluster"):
            out = tmp_path / name
            assert _sweep(out, GRIDS[name], "--scheduler", address) == 0
            assert _files(out) == _files(serial / name)
            workers = {json.loads(p.read_text())["worker"] for p in (out / "costs").iterdir()}
            assert workers and all(w.startswith(f"tcp://{SCHED_HOST}:") for w in workers)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()


def test_a_failing_point_is_reported_and_the_rest_kept(tmp_path, monkeypatch, capsys):
    real = sw.EXPERIMENTS["loss"]

    def run(params):
        if params["seed"] == 2 and params["loss"] > 0:
            raise RuntimeError("this point fails")
        return real.run(params)

    monkeypatch.setitem(sw.EXPERIMENTS, "loss", sw.Experiment(run, real.figures))
    assert _sweep(tmp_path, LOSS, "--serial") == 1
    cap = capsys.readouterr()
    assert cap.err.count("this point fails") == 2
    assert "6 point(s) run" in cap.out and "2 failed" in cap.out
    res = json.loads((tmp_path / "sweep.json").read_text())
    assert res["missing_points"] == 2
    g = res["points"][2]["figures"]["goodput_gbps"]
    assert g["n"] == 1 and g["ci95"] is None              # one seed: a mean, no interval
    assert res["points"][2]["figures"]["ok"]["mean"] == 1.0     # a flag: the fraction held
    monkeypatch.setitem(sw.EXPERIMENTS, "loss", real)
    assert _sweep(tmp_path, LOSS, "--serial") == 0           # the rerun runs the two alone
    assert "2 point(s) run, 6 already in" in capsys.readouterr().out


def test_a_bad_controller_fails_before_any_point(tmp_path, capsys):
    assert _sweep(tmp_path, ["-e", "incast", "-p", "cc=dcqcn+bogus", "--serial"]) == 2
    assert "bogus" in capsys.readouterr().err
    assert not (tmp_path / "points").exists()


# ---------------------------------------------------------------- a grid file that is the command


def test_grid_file_says_its_figures_out_and_title(tmp_path, monkeypatch, capsys):
    """``softnic experiment sweep FILE`` alone: the file names the figures (the
    table's and the plot's), the output directory (relative to the file) and the
    plot's title; the command line's --figures and --out still win."""
    d = tmp_path / "grids"
    d.mkdir()
    f = d / "g.toml"
    f.write_text('experiment = "loss"\nseeds = [1]\nout = "res"\n'
                 'figures = ["goodput_gbps", "retransmitted_pkts"]\n'
                 'title = "goodput against loss"\n[params]\nloss = [0, 0.02]\n'
                 'total = "512KiB"\nmsg = "128KiB"\n')
    g = sw.build_grid(experiment=None, file=str(f), params=[], seeds=None)
    assert g.out == d / "res" and g.title == "goodput against loss"
    assert g.figures == ["goodput_gbps", "retransmitted_pkts"]
    seen = []
    real_plot = sw.plot

    def plot(res, path, figures, *, title=None):
        seen.append((path, figures, title))
        return real_plot(res, path, figures, title=title)

    monkeypatch.setattr(sw, "plot", plot)
    monkeypatch.chdir(tmp_path)                 # out is the file's, not the working directory's
    assert main(["experiment", "sweep", str(f), "--serial", "--no-progress"]) == 0
    table = capsys.readouterr().out
    assert "| loss | goodput_gbps (mean [95 % CI]) | retransmitted_pkts (mean [95 % CI]) |" \
        in table and "timeouts" not in table
    cost = table.split("what each point cost")[1].splitlines()
    assert cost[1] == "| loss | points | events | CPU s | wall s | peak RSS MiB |"
    row = cost[3].strip("| ").split(" | ")
    assert row[:2] == ["0.0", "1"] and int(float(row[2])) > 0 and float(row[3]) > 0
    assert seen == [(d / "res" / "sweep.png", ["goodput_gbps", "retransmitted_pkts"],
                     "goodput against loss")]
    import matplotlib.image
    assert matplotlib.image.imread(d / "res" / "sweep.png").shape[0] == 2 * 280  # 2 panels
    assert len(list((d / "res" / "points").iterdir())) == 2
    other = tmp_path / "other"
    assert main(["experiment", "sweep", str(f), "--serial", "--no-progress", "--out", str(other),
                 "--figures", "timeouts"]) == 0
    assert "| loss | timeouts (mean [95 % CI]) | seeds |" in capsys.readouterr().out
    assert seen[-1][1:] == (["timeouts"], "goodput against loss")
    assert seen[-1][0] == other / "sweep.png"


@pytest.mark.parametrize("line, msg", [
    ('figures = "goodput_gbps"', "figures must be a list"),
    ('figures = []', "figures must be a list"),
    ('figures = ["timeouts", "timeouts"]', "given twice"),
    ('out = 3', "out must be text"),
    ('title = ""', "title must be text"),
    ('plot = "x"', "unknown key"),
])
def test_bad_shown_keys_are_clear_errors(tmp_path, line, msg):
    f = tmp_path / "g.toml"
    f.write_text(f'experiment = "loss"\n{line}\n[params]\nloss = [0, 0.02]\n')
    with pytest.raises(ValueError, match=msg):
        sw.build_grid(experiment=None, file=str(f), params=[], seeds=None)


# ---------------------------------------------------------------- published results


RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def _doc_commands(doc: str) -> dict[str, list[str]]:
    """The ``softnic experiment sweep`` commands a doc shows, by grid file name."""
    import shlex
    found = {}
    for line in doc.splitlines():
        words = shlex.split(line.strip()) if line.startswith("    softnic experiment sweep") \
            else []
        if words:
            found.setdefault(Path(words[3]).stem, []).append(words[4:])
    return found


@pytest.mark.parametrize("name", ["qps", "lossless"])
def test_meta_results_are_the_docs_commands_own(name):
    """docs/results/meta.md's comparisons: each grid file is a 128-host sweep of five
    seeds; each command whose results the doc reports (a part of the file's grid,
    named by -p and --seeds; the bare command runs the whole) has every point
    committed and the doc shows the table it prints from them; sweep.json is what
    one of them aggregates to."""
    from softnic.cli.main import _parser
    full = sw.build_grid(experiment=None, file=str(RESULTS / "meta" / f"{name}.toml"),
                         params=[], seeds=None)
    assert full.experiment == "cluster" and full.fixed["hosts"] == 128
    assert full.seeds == [1, 2, 3, 4, 5] and full.out == RESULTS / "meta" / name
    doc = (RESULTS / "meta.md").read_text()
    reported = [c for c in _doc_commands(doc)[name] if c]
    assert reported
    written = (RESULTS / "meta" / name / "sweep.json").read_text()
    shown = []
    for words in reported:
        args = _parser().parse_args(["experiment", "sweep",
                                     str(RESULTS / "meta" / f"{name}.toml"), *words])
        grid = sw.build_grid(experiment=None, file=args.grid, params=args.param,
                             seeds=args.seeds)
        assert set(map(json.dumps, grid.points())) <= set(map(json.dumps, full.points()))
        res = sw.aggregate(grid, grid.out)
        assert res["missing_points"] == 0, words
        assert all(f in res["points"][0]["figures"] for f in grid.figures)
        assert sw.table(res, grid.figures) in doc, words
        shown.append(sw._dump(res))
    assert written in shown
