"""``softnic experiment sweep``: a grid of one experiment's parameters, times seeds.

A sweep is a set of points, each one run of ``incast``, ``loss`` or ``cluster``
with every parameter fixed, seed included.  A point's figures depend only on
its parameters (virtual time, seeded faults, no global state), so the points
run anywhere: in this process one after another (``serial``), on a Dask
``LocalCluster`` of this machine's cores, or on an existing Dask cluster
(``scheduler``).  The client writes each finished point to
``OUT/points/KEY.json`` (KEY: a hash of the experiment, its parameters and its
seed) and what it cost (wall and CPU seconds, the worker's peak memory) apart,
to ``OUT/costs/KEY.json``; a point already on disk is not run again, so a
stopped sweep resumes where it stopped.  The results (``OUT/sweep.json``,
``sweep.csv``, ``sweep.png``) are then built from the point files alone, so
they are byte for byte the same however the points ran.

Across seeds each figure gets its mean and a 95 % Student-t interval
(``scipy.stats.t``), the usual interval for a handful of seeds.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import os
import resource
import time
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path

# ---------------------------------------------------------------- experiments


@dataclass
class LossConfig:
    """One point of the ``loss`` experiment: one RC flow over a lossy link
    (``experiments.goodput_under_loss``)."""
    loss: float = 0.01
    selective_repeat: bool = False
    rate_gbps: float = 10.0
    delay: float = 150e-6
    total: int = 8 << 20
    msg: int = 1 << 20
    window: int = 128
    mtu: int = 4096
    seed: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss must be in [0, 1), not {self.loss}")
        if self.msg < 1 or self.total < self.msg:
            raise ValueError(f"total ({self.total}) must hold at least one msg ({self.msg})")


def _run_incast(params: dict) -> dict:
    from ..experiments.bottleneck import IncastConfig, incast
    return incast(IncastConfig(**params))["summary"]


def _run_loss(params: dict) -> dict:
    from ..experiments.bottleneck import goodput_under_loss
    p = dict(params)
    rate = p.pop("rate_gbps") * 1e9
    return goodput_under_loss(p.pop("loss"), p.pop("selective_repeat"), rate=rate, **p)


def _run_cluster(params: dict) -> dict:
    from ..experiments.cluster import ClusterConfig, run
    return run(ClusterConfig(**params))["summary"]


def _config(name: str):
    if name == "incast":
        from ..experiments.bottleneck import IncastConfig
        return IncastConfig
    if name == "cluster":
        from ..experiments.cluster import ClusterConfig
        return ClusterConfig
    return LossConfig


@dataclass(frozen=True)
class Experiment:
    run: typing.Callable[[dict], dict]
    figures: tuple          # what the printed table and the plot show by default


EXPERIMENTS = {
    "incast": Experiment(_run_incast, ("jain_steady", "goodput_fraction",
                                       "queue_steady_p99_kb", "switch_drops")),
    "loss": Experiment(_run_loss, ("goodput_gbps", "retransmitted_pkts", "timeouts")),
    "cluster": Experiment(_run_cluster, ("completion_s", "slowdown", "fct_p99_s",
                                         "switch_drops")),
}

#: what a run measures of the machine rather than of the experiment: kept with
#: the point's cost, never with its figures
COST_KEYS = ("wall_s",)

#: float parameters given in time units on the command line (``2ms``)
_TIME_FIELDS = {"duration", "late_join", "delay", "bin", "sample", "max_time"}


def optional_params(experiment: str) -> set[str]:
    """The parameters of ``experiment`` that may be None (``none`` on the command line)."""
    hints = typing.get_type_hints(_config(experiment))
    return {n for n, t in hints.items() if type(None) in typing.get_args(t)}


def param_kinds(experiment: str) -> dict[str, str]:
    """Each parameter of ``experiment`` (but its seed) and its kind: bool, int
    (sizes with units too), time, float or str."""
    cls = _config(experiment)
    hints = typing.get_type_hints(cls)
    kinds = {}
    for f in fields(cls):
        if f.name == "seed":
            continue
        t = hints[f.name]
        args = set(typing.get_args(t)) - {type(None)}
        base = args.pop() if len(args) == 1 else t
        if base is bool:
            kinds[f.name] = "bool"
        elif base is int:
            kinds[f.name] = "int"
        elif base is float:
            kinds[f.name] = "time" if f.name in _TIME_FIELDS else "float"
        else:
            kinds[f.name] = "str"
    return kinds


def parse_param(experiment: str, name: str, value):
    """One parameter value from the command line (text) or a TOML file (text,
    number or boolean), in its base unit; ValueError names what is wrong."""
    kinds = param_kinds(experiment)
    if name == "seed":
        raise ValueError("seeds are given with --seeds (or 'seeds' in the grid file)")
    if name not in kinds:
        raise ValueError(f"{experiment} has no parameter {name!r} (it has: "
                         f"{', '.join(sorted(kinds))})")
    kind = kinds[name]
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"{name}: {value!r} is not text")
        if name == "cc":
            import congestion
            congestion.parse_spec(value)     # a bad spec fails here, not in every point
        return value
    if isinstance(value, str) and value.strip().lower() == "none":
        if name not in optional_params(experiment):
            raise ValueError(f"{name}: takes a value, not none")
        return None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}: {value!r} is not true or false")
    if isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not a number")
    if isinstance(value, (int, float)):
        if kind == "int":
            if value != int(value):
                raise ValueError(f"{name}: {value!r} is not a whole number")
            return int(value)
        return float(value)
    from congestion.params import parse_value
    try:
        return parse_value({"int": "size"}.get(kind, kind), str(value).strip())
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


# ---------------------------------------------------------------- the grid


@dataclass
class Grid:
    """What to run: fixed parameters, the axes (each a parameter and its values,
    in order) and the seeds."""
    experiment: str
    fixed: dict
    axes: dict
    seeds: list
    #: how the results are shown, if the grid file says (else the command line's or
    #: the defaults): the figures of the table and the plot, the output directory
    #: (relative to the grid file's own), and the plot's title
    figures: list | None = None
    out: Path | None = None
    title: str | None = None

    def points(self) -> list[dict]:
        """Every point's parameters (all of them, defaults included), axes in
        grid order, seeds innermost."""
        cls = _config(self.experiment)
        names = list(self.axes)
        out = []
        for combo in itertools.product(*self.axes.values()):
            for seed in self.seeds:
                cfg = cls(**{**self.fixed, **dict(zip(names, combo)), "seed": seed})
                out.append(asdict(cfg))
        return out


def parse_seeds(text) -> list[int]:
    """``1,2,3``, ``1-5`` or a list of ints -> seeds, in order, each once."""
    items = text if isinstance(text, list) else str(text).split(",")
    seeds = []
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"seeds: {item!r} is not a seed")
        if isinstance(item, int):
            seeds.append(item)
            continue
        item = str(item).strip()
        lo, sep, hi = item.partition("-")
        try:
            seeds.extend(range(int(lo), int(hi) + 1) if sep and lo else [int(item)])
        except ValueError:
            raise ValueError(f"seeds: {item!r} is not a seed or a range a-b") from None
    if not seeds:
        raise ValueError("seeds: none given")
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds: a seed is given twice")
    return seeds


def _values(experiment: str, name: str, raw) -> list:
    vals = raw if isinstance(raw, list) else [raw]
    if not vals:
        raise ValueError(f"{name}: no values")
    out = [parse_param(experiment, name, v) for v in vals]
    if len(set(map(repr, out))) != len(out):
        raise ValueError(f"{name}: a value is given twice")
    return out


#: a grid file's keys for how its results are shown
SHOWN_KEYS = ("figures", "out", "title")


def _shown(file: str, doc: dict) -> dict:
    """A grid file's ``figures``, ``out`` and ``title``, checked; ``out`` made relative
    to the file's directory."""
    shown: dict = {}
    figures = doc.get("figures")
    if figures is not None:
        if (not isinstance(figures, list) or not figures
                or not all(isinstance(f, str) and f for f in figures)):
            raise ValueError(f"{file}: figures must be a list of figure names")
        if len(set(figures)) != len(figures):
            raise ValueError(f"{file}: figures: a figure is given twice")
        shown["figures"] = figures
    for key in ("out", "title"):
        val = doc.get(key)
        if val is not None and (not isinstance(val, str) or not val.strip()):
            raise ValueError(f"{file}: {key} must be text")
    if doc.get("out") is not None:
        shown["out"] = Path(file).parent / doc["out"]
    if doc.get("title") is not None:
        shown["title"] = doc["title"]
    return shown


def split_cli_values(name: str, text: str) -> list[str]:
    """``-p NAME=V1,V2``'s values; a controller spec (``cc``) may itself hold
    commas, so ``cc``'s are split on ``+``, as ``experiment incast --cc``'s."""
    return [v for v in text.split("+" if name == "cc" else ",")]


def build_grid(*, experiment: str | None, file: str | None, params: list[str],
               seeds: str | None) -> Grid:
    """The grid from a TOML file and/or ``-p NAME=V1,V2,...`` options (which
    add to the file's, or replace a parameter it names).  The TOML file::

        experiment = "incast"
        seeds = [1, 2, 3]           # or "1-3"
        [params]
        duration = "2ms"            # one value: fixed
        cc = ["dcqcn", "hpcc"]      # a list: an axis of the grid
        senders = [4, 8]

    A grid file may also say how its results are shown, so that the file alone is
    the command: ``figures = ["completion_s", "slowdown"]`` (the table's and the
    plot's), ``out = "qps"`` (the output directory, relative to the file's) and
    ``title = "..."`` (the plot's).  The plot's x axis is the first axis.
    """
    raw: dict = {}
    file_seeds = None
    shown: dict = {}
    if file is not None:
        import tomllib
        try:
            with open(file, "rb") as f:
                doc = tomllib.load(f)
        except OSError as e:
            raise ValueError(f"{file}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{file}: {e}") from None
        unknown = set(doc) - {"experiment", "seeds", "params", *SHOWN_KEYS}
        if unknown:
            raise ValueError(f"{file}: unknown key(s) {', '.join(sorted(unknown))} (keys: "
                             f"experiment, seeds, {', '.join(SHOWN_KEYS)}, [params])")
        shown = _shown(file, doc)
        if experiment is not None and doc.get("experiment", experiment) != experiment:
            raise ValueError(f"{file} is a grid of {doc['experiment']}, not {experiment}")
        experiment = doc.get("experiment", experiment)
        file_seeds = doc.get("seeds")
        if not isinstance(doc.get("params", {}), dict):
            raise ValueError(f"{file}: params must be a table")
        raw.update(doc.get("params", {}))
    if experiment is None:
        raise ValueError("name the experiment (incast, loss or cluster) or give a grid file")
    if experiment not in EXPERIMENTS:
        raise ValueError(f"no experiment {experiment!r} (incast, loss or cluster)")
    for item in params:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"-p {item!r}: give NAME=VALUE or NAME=V1,V2,...")
        raw[name.strip()] = split_cli_values(name.strip(), text)
    fixed, axes = {}, {}
    for name, val in raw.items():
        vals = _values(experiment, name, val)
        if len(vals) == 1:
            fixed[name] = vals[0]
        else:
            axes[name] = vals
    seed_list = parse_seeds(seeds if seeds is not None else
                            (file_seeds if file_seeds is not None else "1"))
    grid = Grid(experiment, fixed, axes, seed_list, **shown)
    grid.points()         # every point's configuration checks (ValueError) before any runs
    return grid


# ---------------------------------------------------------------- one point


def point_key(experiment: str, params: dict) -> str:
    """The point's name on disk: a hash of the experiment and every parameter."""
    text = json.dumps({"experiment": experiment, "params": params}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def run_point(experiment: str, params: dict) -> tuple[dict, dict]:
    """Run one point (on whichever worker); return its figures and, apart, its cost."""
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    summary = EXPERIMENTS[experiment].run(params)
    cost = {"wall_s": time.perf_counter() - wall0, "cpu_s": time.thread_time() - cpu0,
            "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_pid": os.getpid(), "events": summary.get("events")}
    figures = {k: v for k, v in summary.items() if k not in COST_KEYS}
    return figures, cost


def _dump(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a sweep stopped mid-write leaves no half a point."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


def _save(out: Path, experiment: str, params: dict, figures: dict, cost: dict) -> None:
    key = point_key(experiment, params)
    _write(out / "points" / f"{key}.json", _dump(
        {"experiment": experiment, "key": key, "params": params, "figures": figures}))
    _write(out / "costs" / f"{key}.json", _dump(cost))


def _load(out: Path, experiment: str, params: dict) -> dict | None:
    path = out / "points" / f"{point_key(experiment, params)}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if doc.get("params") != params or doc.get("experiment") != experiment:
        return None                 # not this point's (a hash collision, or edited)
    return doc["figures"]


# ---------------------------------------------------------------- running


@dataclass
class RunReport:
    ran: int
    from_disk: int
    failed: list          # (params, error text)
    wall_s: float


def execute(grid: Grid, out: Path, *, serial: bool = False, scheduler: str | None = None,
            workers: int | None = None, progress: bool = True) -> RunReport:
    """Run the grid's points not yet on disk: here (``serial``), on a Dask
    LocalCluster of ``workers`` processes (default: this machine's cores), or on
    the Dask cluster whose scheduler is at ``scheduler``."""
    (out / "points").mkdir(parents=True, exist_ok=True)
    (out / "costs").mkdir(parents=True, exist_ok=True)
    points = grid.points()
    todo = [p for p in points if _load(out, grid.experiment, p) is None]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(points), initial=len(points) - len(todo), unit="point",
                   desc=f"sweep {grid.experiment}")
    failed = []
    wall0 = time.perf_counter()
    try:
        if serial or not todo:
            for p in todo:
                try:
                    figures, cost = run_point(grid.experiment, p)
                except Exception as e:           # noqa: BLE001 - reported, the rest go on
                    failed.append((p, f"{type(e).__name__}: {e}"))
                else:
                    _save(out, grid.experiment, p, figures, cost)
                if bar is not None:
                    bar.update(1)
        else:
            _execute_dask(grid.experiment, todo, out, scheduler, workers, bar, failed)
    finally:
        if bar is not None:
            bar.close()
    return RunReport(len(todo) - len(failed), len(points) - len(todo), failed,
                     time.perf_counter() - wall0)


def _execute_dask(experiment, todo, out, scheduler, workers, bar, failed) -> None:
    import logging
    from distributed import Client, LocalCluster, as_completed
    cluster = None
    if scheduler is None:
        cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=None,
                               silence_logs=logging.ERROR)
        client = Client(cluster)
    else:
        client = Client(scheduler)
    try:
        futures = {}
        for p in todo:
            fut = client.submit(run_point, experiment, p, pure=False,
                                key=f"softnic-sweep-{point_key(experiment, p)}")
            futures[fut] = p
        for fut in as_completed(futures):
            p = futures[fut]
            try:
                figures, cost = fut.result()
            except Exception as e:               # noqa: BLE001 - reported, the rest go on
                failed.append((p, f"{type(e).__name__}: {e}"))
            else:
                cost["worker"] = _worker_of(client, fut)
                _save(out, experiment, p, figures, cost)
            if bar is not None:
                bar.update(1)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _worker_of(client, fut) -> str | None:
    try:
        who = client.who_has([fut])
    except Exception:                            # noqa: BLE001 - a cost detail only
        return None
    held = who.get(fut.key) or ()
    return next(iter(held), None)


# ---------------------------------------------------------------- results


def _t_interval(xs: list[float]) -> tuple[float, float, float | None, float | None]:
    """Mean, sample standard deviation and the 95 % Student-t interval of the mean
    (None with one value)."""
    n = len(xs)
    mean = math.fsum(xs) / n
    if n < 2:
        return mean, 0.0, None, None
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    if sd == 0:
        return mean, 0.0, mean, mean
    from scipy import stats
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def _numeric(v) -> bool:
    """A figure to average: a finite number, or a flag (``finished``, ``ok``) as 0 or 1,
    whose mean is the fraction of seeds it held for."""
    return isinstance(v, (int, float)) and math.isfinite(v)


def aggregate(grid: Grid, out: Path) -> dict:
    """The sweep's results from the point files: per grid point (across seeds),
    each numeric figure's n, mean, standard deviation and 95 % interval."""
    points = grid.points()
    names = list(grid.axes)
    params = set(points[0])
    rows, missing = [], 0
    per = len(grid.seeds)
    for i in range(0, len(points), per):
        group = points[i:i + per]
        coords = {n: group[0][n] for n in names}
        by_seed = {}
        for p in group:
            figs = _load(out, grid.experiment, p)
            if figs is None:
                missing += 1
            else:
                by_seed[str(p["seed"])] = figs
        order = []
        for figs in by_seed.values():
            for k, v in figs.items():
                if k not in order and k not in params and (_numeric(v) or v is None):
                    order.append(k)
        stats = {}
        for k in order:
            xs = [float(figs[k]) if isinstance(figs[k], bool) else figs[k]
                  for figs in by_seed.values() if _numeric(figs.get(k))]
            if not xs:
                stats[k] = {"n": 0, "mean": None, "sd": None, "ci95": None}
                continue
            mean, sd, lo, hi = _t_interval(xs)
            stats[k] = {"n": len(xs), "mean": mean, "sd": sd,
                        "ci95": None if lo is None else [lo, hi]}
        rows.append({"point": coords, "seeds": by_seed, "figures": stats})
    return {"experiment": grid.experiment, "fixed": grid.fixed, "axes": grid.axes,
            "seeds": grid.seeds, "missing_points": missing, "points": rows}


def write_results(res: dict, out: Path, figures: list[str], *,
                  title: str | None = None) -> list[Path]:
    """sweep.json, sweep.csv (one row per grid point and figure) and sweep.png."""
    j = out / "sweep.json"
    _write(j, _dump(res))
    names = list(res["axes"])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(names + ["figure", "n", "mean", "sd", "ci95_low", "ci95_high"])
    for row in res["points"]:
        for k, s in row["figures"].items():
            lo, hi = s["ci95"] if s["ci95"] else ("", "")
            w.writerow([row["point"][n] for n in names]
                       + [k, s["n"], _cell(s["mean"]), _cell(s["sd"]), _cell(lo), _cell(hi)])
    c = out / "sweep.csv"
    _write(c, buf.getvalue())
    p = plot(res, out / "sweep.png", figures, title=title)
    return [j, c, p]


def _cell(v) -> str:
    return "" if v is None or v == "" else repr(v)


def _label(point: dict, names: list[str]) -> str:
    return ", ".join(f"{n}={point[n]}" for n in names) or "all"


def table(res: dict, figures: list[str]) -> str:
    """The printed table: a row per grid point, for each figure its mean and 95 %
    interval across seeds."""
    names = list(res["axes"])
    head = names + [f"{f} (mean [95 % CI])" for f in figures] + ["seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in res["points"]:
        cells = [str(row["point"][n]) for n in names]
        for f in figures:
            s = row["figures"].get(f)
            if s is None or s["mean"] is None:
                cells.append("n/a")
            elif s["ci95"] is None:
                cells.append(f"{s['mean']:.4g}")
            else:
                cells.append(f"{s['mean']:.4g} [{s['ci95'][0]:.4g}, {s['ci95'][1]:.4g}]")
        cells.append(str(len(row["seeds"])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(grid: Grid, out: Path) -> str:
    """What the points cost, per grid point (from ``OUT/costs/``, which the results
    leave out since it is the machine's): the points measured, and the mean events,
    CPU seconds and wall seconds of one point, and the largest peak RSS of a worker
    that ran one (a worker's peak is over every point it ran)."""
    names = list(grid.axes)
    head = names + ["points", "events", "CPU s", "wall s", "peak RSS MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    points = grid.points()
    per = len(grid.seeds)
    for i in range(0, len(points), per):
        costs = []
        for p in points[i:i + per]:
            try:
                costs.append(json.loads((out / "costs" / f"{point_key(grid.experiment, p)}"
                                         ".json").read_text()))
            except (OSError, ValueError):
                pass
        cells = [str(points[i][n]) for n in names] + [str(len(costs))]
        if costs:
            events = [c["events"] for c in costs if c.get("events") is not None]
            cells += [f"{math.fsum(events) / len(events):.4g}" if events else "n/a",
                      f"{math.fsum(c['cpu_s'] for c in costs) / len(costs):.4g}",
                      f"{math.fsum(c['wall_s'] for c in costs) / len(costs):.4g}",
                      f"{max(c['worker_peak_rss_mib'] for c in costs):.0f}"]
        else:
            cells += ["n/a"] * 4
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(res: dict, path: Path, figures: list[str], *, title: str | None = None) -> Path:
    """One panel per figure: its mean against the grid's first axis, a line per
    value of the other axes, the 95 % interval as error bars; ``title`` above."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["axes"])
    xname, rest = (names[0], names[1:]) if names else (None, [])
    xs = res["axes"][xname] if xname else ["all"]
    numeric_x = all(_numeric(x) and not isinstance(x, bool) for x in xs)
    fig, axes = plt.subplots(len(figures), 1, figsize=(7, 2.8 * len(figures)), squeeze=False)
    for ax, f in zip(axes[:, 0], figures):
        lines: dict = {}
        for row in res["points"]:
            lines.setdefault(_label(row["point"], rest), []).append(row)
        for label, rows in lines.items():
            px, py, lo, hi = [], [], [], []
            for row in rows:
                s = row["figures"].get(f)
                if s is None or s["mean"] is None:
                    continue
                x = row["point"][xname] if xname else "all"
                px.append(x if numeric_x else xs.index(x))
                py.append(s["mean"])
                ci = s["ci95"] or [s["mean"], s["mean"]]
                lo.append(s["mean"] - ci[0])
                hi.append(ci[1] - s["mean"])
            if px:
                ax.errorbar(px, py, yerr=[lo, hi], marker="o", capsize=3, lw=1, label=label)
        ax.set_ylabel(f)
        if not numeric_x:
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.grid(alpha=0.3)
        if rest:
            ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel(xname or "")
    fig.suptitle((f"{title}\n" if title else "") +
                 f"{res['experiment']} sweep: mean and 95 % interval over seeds "
                 f"{','.join(map(str, res['seeds']))}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path
