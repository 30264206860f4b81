"""Scenario families: does a feature of cellsched pay where nobody tuned it?

From a seed, `generate` makes a scenario nobody chose by hand:

* a cluster of 2 to 4 of Arena's GPU types (A100, V100, A40, A10), each with
  its own node size (the sizes Arena's cluster uses, or half/double them)
  and 4 to 32 GPUs; network cards of 10, 25 or 100 Gb/s, or none (no
  contention modelled); with cards, half the scenarios split the nodes into
  two racks whose uplinks are oversubscribed 2 to 4x;
* a trace cut from the shipped Philly trace: a window at a random place,
  60 to 160 of its jobs drawn with per-family weights (BERT, MoE, wide
  ResNet; the model mix varies), requested types mapped onto the cluster's
  (a type the cluster lacks becomes one it has), requests capped at a
  type's GPUs, arrivals scaled to a load of 0.5 to 3 (GPUs asked per GPU
  and second, against the whole trace on Arena's 1,280 GPUs).

Each scenario is one `cellsched simulate --realistic` run (its own seed for
the noise), so every variant sees the same truth, noise and restart costs:
`cellsched` against each feature switched off (with ``--noise-seeds K``, K
such runs under different truth noise, pooled):

* ``mixed+sharding``: ``cellsched:mixed_cells=false,state_sharding=false``
* ``contention``: ``cellsched:contention_aware=false`` (scenarios with cards)
* ``calibration``: ``cellsched:calibrate=false``
* ``restart_history`` (only when asked for, not in ``all``):
  ``cellsched:restart_history=true``, an opt-in rule rather than a feature
  switched off: its ratio is the default's against it (> 1: the opt-in pays);
* ``sia_restarts`` (only when asked for, likewise):
  ``cellsched:restart_history=true,restart_on_throughput=true``, the restart
  rule of the Sia artifact's Sia whole: its horizon and its factor on throughput;
* ``null`` (only when asked for, not in ``all``): ``cellsched:age_scale_s=3601``,
  a change that should change nothing (the age bonus's scale moves by
  0.03%). It changes which of two near-equal plans a round returns, so its
  ratio is the spread that reordering alone gives a scenario: what a bound
  on a feature's worst ratio has to clear.

The ratio of a feature is cellsched's average JCT over the jobs both runs
finished against the run without it (< 1: the feature pays); over K noise
seeds, over the (noise seed, job) pairs both finished. On a small, loaded
cluster one run's ratio swings by a few percent with the noise seed alone
(a different truth reorders the queue), which K > 1 averages out. For
contention the rows also give the share of the summed JCT each variant's
jobs lost to shared links: what awareness could win back at most, directly. The report
gives per feature the median, the 10th and 90th percentiles and the worst
ratio, over all scenarios and, for contention, over those whose cards are
10-25 Gb/s and where cellsched ran a multi-node job.

Seeds: `HELD_OUT` (1000-1029) were fixed before any policy change made for
this benchmark and are what the results page reports; tune on others
(`--seeds 0-29`). Runs are resumable: a scenario whose results.json holds
every variant is not run again. Scenarios run in parallel (`--workers`),
each simulation on one core.

    python benchmarks/scenarios.py --out /tmp/scen [--seeds 1000-1029] [--workers 2] [--features all] [--noise-seeds 1]

Prints one JSON line per scenario and feature, then one summary line per
feature, and writes OUT/scenarios.md and OUT/scenarios.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HELD_OUT = tuple(range(1000, 1030))
#: a scenario's k-th noise seed is its seed + k x this (`--noise-seeds`; k = 0: the seed itself)
NOISE_STRIDE = 100_000
TYPES = ("a100", "v100", "a40", "a10")
#: node sizes per type: Arena's (A100 4, V100 16, A40/A10 2) and nearby ones
NODE_SIZES = {"a100": (4, 8), "v100": (4, 8, 16), "a40": (2, 4), "a10": (2, 4)}
NICS = (None, 10.0, 25.0, 100.0)
FAMILIES = ("bert", "moe", "wide_resnet")
ARENA_GPUS = 1280
WITH = "cellsched"
FEATURES = {
    "mixed+sharding": "cellsched:mixed_cells=false,state_sharding=false",
    "contention": "cellsched:contention_aware=false",
    "calibration": "cellsched:calibrate=false",
    "null": "cellsched:age_scale_s=3601",
    "restart_history": "cellsched:restart_history=true",
    "sia_restarts": "cellsched:restart_history=true,restart_on_throughput=true",
}
#: what `--features all` runs: every feature but the null change
ALL = ("mixed+sharding", "contention", "calibration")


@dataclass(frozen=True)
class Group:
    gpu_type: str
    count: int
    gpus_per_node: int
    rack: str = ""


@dataclass(frozen=True)
class Scenario:
    seed: int
    groups: tuple[Group, ...]
    nic_gbps: float | None
    uplink_gbps: dict[str, float] = field(default_factory=dict)
    jobs: int = 100
    load: float = 1.0
    start: float = 0.0  # where the trace window starts (fraction of the trace)
    weights: dict[str, float] = field(default_factory=dict)  # model family -> weight

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus_per_node for g in self.groups)

    def gpus_of(self, gpu_type: str) -> int:
        return sum(g.count * g.gpus_per_node for g in self.groups if g.gpu_type == gpu_type)

    def cluster_toml(self) -> str:
        from solver.contract.profiles.arena import load_device_specs

        mem = load_device_specs()["simulator_gpu_specs"]
        lines = [f'name = "scenario-{self.seed}"', ""]
        for g in self.groups:
            lines += ["[[nodes]]", f'gpu_type = "{g.gpu_type}"', f"count = {g.count}"]
            lines += [f"gpus_per_node = {g.gpus_per_node}", f"mem_gb = {mem[g.gpu_type]['max_mem_gb']}"]
            if self.nic_gbps is not None:
                lines.append(f"nic_gbps = {self.nic_gbps:g}")
            if g.rack:
                lines.append(f'rack = "{g.rack}"')
            lines.append("")
        if self.uplink_gbps:
            lines.append("[uplink_gbps]")
            lines += [f"{r} = {v:g}" for r, v in sorted(self.uplink_gbps.items())]
        return "\n".join(lines) + "\n"


def generate(seed: int) -> Scenario:
    """The scenario of `seed` (module doc); the same seed gives the same scenario."""
    rng = random.Random(f"scenario:{seed}")
    types = rng.sample(TYPES, rng.randint(2, 4))
    groups = []
    for t in types:
        size = rng.choice(NODE_SIZES[t])
        gpus = rng.choice([g for g in (4, 8, 16, 32) if g >= size])
        groups.append(Group(t, gpus // size, size))
    nic = rng.choice(NICS)
    uplinks: dict[str, float] = {}
    if nic is not None and sum(g.count for g in groups) >= 4 and rng.random() < 0.5:
        # two racks: the groups split by alternation; each uplink carries its rack's cards / oversubscription
        groups = [Group(g.gpu_type, g.count, g.gpus_per_node, f"r{i % 2}") for i, g in enumerate(groups)]
        for r in ("r0", "r1"):
            nodes = sum(g.count for g in groups if g.rack == r)
            if nodes:
                uplinks[r] = round(nic * nodes / rng.choice((2, 3, 4)), 3)
    weights = {f: round(rng.gammavariate(1.0, 1.0), 4) for f in FAMILIES}
    return Scenario(
        seed,
        tuple(groups),
        nic,
        uplinks,
        jobs=rng.randrange(60, 161, 10),
        load=round(rng.uniform(0.5, 3.0), 2),
        start=round(rng.random(), 4),
        weights=weights,
    )


def family(model: str) -> str:
    return model.split("__")[0]


def trace_rows(scn: Scenario, rows: Sequence[dict[str, str]]) -> tuple[list[dict[str, str]], float]:
    """The scenario's jobs cut from `rows` (the Philly trace, in submit order),
    and the share of the window's jobs they are."""
    rng = random.Random(f"trace:{scn.seed}")
    window = min(len(rows), 3 * scn.jobs)
    first = int(scn.start * (len(rows) - window))
    cut = rows[first : first + window]
    weight = [scn.weights.get(family(r["model_name"]), 0.0) + 1e-6 for r in cut]
    picked: set[int] = set()
    while len(picked) < min(scn.jobs, len(cut)):  # weighted draws without replacement
        picked.add(rng.choices(range(len(cut)), weight)[0])
    have = [g.gpu_type for g in scn.groups]
    out = []
    for i in sorted(picked):
        r = dict(cut[i])
        if r["gpu_type"] not in have:
            r["gpu_type"] = rng.choice(have)
        r["num_gpu"] = str(min(int(r["num_gpu"]), scn.gpus_of(r["gpu_type"])))
        out.append(r)
    return out, len(out) / window


def philly() -> list[dict[str, str]]:
    from solver.contract.profiles.arena import TRACE_FILE, shipped_path

    with open(shipped_path(TRACE_FILE), newline="") as f:
        return sorted(csv.DictReader(f), key=lambda r: float(r["submission_time"]))


def variants(scn: Scenario, features: Iterable[str]) -> list[str]:
    """The policies of the scenario's run: cellsched, then each feature off
    (contention only where the cluster has cards)."""
    return [WITH] + [FEATURES[f] for f in features if f != "contention" or scn.nic_gbps is not None]


def noise_seed(scn: Scenario, k: int) -> int:
    """The simulator's seed (truth noise) of the scenario's k-th run."""
    return scn.seed + NOISE_STRIDE * k


def run(scn: Scenario, out: Path, features: Sequence[str], rows: Sequence[dict[str, str]], noise: int = 0) -> Path:
    """Simulate the scenario under its `noise`-th noise seed (not again when
    its results hold every variant)."""
    d = out / f"scenario-{scn.seed}"
    if noise:
        d = d / f"noise-{noise}"
    results = d / "results.json"
    want = variants(scn, features)
    if results.exists() and set(want) <= set(json.loads(results.read_text())["runs"]):
        return results
    d.mkdir(parents=True, exist_ok=True)
    (d / "cluster.toml").write_text(scn.cluster_toml())
    jobs, share = trace_rows(scn, rows)
    with open(d / "trace.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(jobs[0]))
        w.writeheader()
        w.writerows(jobs)
    (d / "scenario.json").write_text(json.dumps(asdict(scn), indent=1))
    rate = scn.load * scn.total_gpus / ARENA_GPUS / share
    cmd = [sys.executable, "-m", "slurm_ext", "simulate", "--realistic", "--seed", str(noise_seed(scn, noise))]
    cmd += ["--trace", str(d / "trace.csv"), "--cluster", str(d / "cluster.toml"), "--arrival-rate", f"{rate:.6g}"]
    for p in want:
        cmd += ["--policy", p]
    cmd += ["--workers", "1", "--no-plots", "--json", "--out", str(d)]
    with open(d / "simulate.log", "w") as log:
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)
    return results


def multi_node(cells: Iterable[str]) -> bool:
    """Does one of these cell keys (``type:NxG:ppK``) span several nodes?"""
    for c in cells:
        try:
            if int(c.split(":")[1].split("x")[0]) > 1:
                return True
        except (IndexError, ValueError):
            continue
    return False


def ratios(scn: Scenario, docs: dict | Sequence[dict]) -> list[dict[str, object]]:
    """One row per feature of a scenario's runs (one results.json per noise
    seed): the ratio on/off (module doc), over the (noise seed, job) pairs
    both variants finished; for contention also the share of those jobs'
    summed JCT that each variant's runs lost to shared links (the room
    contention awareness has), where the results record it."""
    runs_of = [d["runs"] for d in ([docs] if isinstance(docs, dict) else docs)]

    def jct(runs: dict, p: str) -> dict[str, tuple[float, float]]:
        return {
            j["job_id"]: (j["jct"], j.get("contended_s", math.nan))
            for j in runs[p]["jobs"]
            if j["finished"] and j["jct"] is not None
        }

    multi = any(multi_node(j["cells"]) for runs in runs_of for j in runs[WITH]["jobs"])
    out = []
    for feat, off_name in FEATURES.items():
        if any(off_name not in runs for runs in runs_of):
            continue
        pairs_on, pairs_off, finished_on, finished_off = [], [], 0, 0
        for runs in runs_of:
            on, off = jct(runs, WITH), jct(runs, off_name)
            finished_on, finished_off = finished_on + len(on), finished_off + len(off)
            common = sorted(set(on) & set(off))
            pairs_on += [on[j] for j in common]
            pairs_off += [off[j] for j in common]
        a = statistics.fmean(t for t, _ in pairs_on) if pairs_on else math.nan
        b = statistics.fmean(t for t, _ in pairs_off) if pairs_off else math.nan
        row: dict[str, object] = {
            "seed": scn.seed,
            "feature": feat,
            "ratio": round(a / b, 4) if pairs_on and b > 0 else None,
            "noise_seeds": len(runs_of),
            "jobs": sum(len(runs[WITH]["jobs"]) for runs in runs_of),
            "finished_on": finished_on,
            "finished_off": finished_off,
            "jobs_common": len(pairs_on),
            "gpus": scn.total_gpus,
            "types": len(scn.groups),
            "nic_gbps": scn.nic_gbps,
            "racks": bool(scn.uplink_gbps),
            "load": scn.load,
            "multi_node": multi,
        }
        if feat == "contention":
            row["contended_on"] = lost_share(pairs_on)
            row["contended_off"] = lost_share(pairs_off)
        out.append(row)
    return out


def lost_share(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Summed seconds lost to shared links / summed JCT of (JCT, lost) pairs
    (None when the results do not record the loss)."""
    total = sum(t for t, _ in pairs)
    if not pairs or total <= 0 or any(math.isnan(c) for _, c in pairs):
        return None
    return round(sum(c for _, c in pairs) / total, 4)


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, linear between the order statistics."""
    v = sorted(values)
    x = q * (len(v) - 1)
    lo = math.floor(x)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (x - lo)


#: the summary group of contention on 10-25 Gb/s cards where cellsched ran a multi-node job
SLOW_MULTI_NODE = "contention (10-25 Gb/s, multi-node)"


def slow_multi_node(row: dict[str, object]) -> bool:
    """Are the row's cards 10-25 Gb/s, with a multi-node job run?"""
    nic = row["nic_gbps"]
    return nic is not None and 10 <= float(nic) <= 25 and bool(row["multi_node"])  # type: ignore[arg-type]


def summary(rows: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """Per feature (and for contention on 10-25 Gb/s cards with multi-node
    jobs): the distribution of the ratios, and for contention the share of
    JCT lost to shared links."""
    groups: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        if r["ratio"] is None:
            continue
        groups.setdefault(str(r["feature"]), []).append(r)
        if r["feature"] == "contention" and slow_multi_node(r):
            groups.setdefault(SLOW_MULTI_NODE, []).append(r)
    out = []
    for f, group in groups.items():
        v = [float(r["ratio"]) for r in group]  # type: ignore[arg-type]
        out.append(
            {
                "summary": True,
                "feature": f,
                "scenarios": len(v),
                "median": round(statistics.median(v), 4),
                "p10": round(pct(v, 0.1), 4),
                "p90": round(pct(v, 0.9), 4),
                "worst": round(max(v), 4),
                "best": round(min(v), 4),
                "worse_than_off_by_1pct": sum(x > 1.01 for x in v),
                **_lost(group),
            }
        )
    return out


def _lost(group: Sequence[dict[str, object]]) -> dict[str, object]:
    """The median share of JCT lost to shared links, with awareness and
    without, over the rows of `group` that record it (contention's)."""
    recorded = [r for r in group if r.get("contended_off") is not None]
    on = [float(r["contended_on"]) for r in recorded]  # type: ignore[arg-type]
    off = [float(r["contended_off"]) for r in recorded]  # type: ignore[arg-type]
    if not off:
        return {}
    return {
        "lost_to_links_on_median": round(statistics.median(on), 4),
        "lost_to_links_off_median": round(statistics.median(off), 4),
        "lost_to_links_off_max": round(max(off), 4),
    }


def markdown(rows: Sequence[dict[str, object]], sums: Sequence[dict[str, object]], argv: Sequence[str]) -> str:
    lines = ["    python benchmarks/scenarios.py " + " ".join(argv), ""]
    lines += [
        "| feature | scenarios | median | p10 | p90 | worst | best | > 1.01 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in sums:
        cells = [s["feature"], s["scenarios"], s["median"], s["p10"], s["p90"], s["worst"], s["best"]]
        lines.append("| " + " | ".join(str(c) for c in [*cells, s["worse_than_off_by_1pct"]]) + " |")
    for s in sums:
        if "lost_to_links_off_median" in s:
            lines.append(
                f"\n{s['feature']}: share of JCT lost to shared links, median {s['lost_to_links_on_median']} "
                f"with awareness, {s['lost_to_links_off_median']} without (max {s['lost_to_links_off_max']})."
            )
    head = "| seed | feature | ratio | noise seeds | finished on / off of | GPUs | types | NIC Gb/s | racks | load |"
    lines += ["", head + " lost to links on / off |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fin = f"{r['finished_on']} / {r['finished_off']} of {r['jobs']}"
        lost = f"{r['contended_on']} / {r['contended_off']}" if r.get("contended_off") is not None else None
        cells = [r["seed"], r["feature"], r["ratio"], r.get("noise_seeds", 1), fin, r["gpus"], r["types"]]
        cells += [r["nic_gbps"], r["racks"], r["load"], lost]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    feats = [f for f in FEATURES if any(r["feature"] == f and r["ratio"] is not None for r in rows)]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    data = [[float(r["ratio"]) for r in rows if r["feature"] == f and r["ratio"] is not None] for f in feats]  # type: ignore[arg-type]
    ax.boxplot(data, whis=(10, 90), showfliers=True)
    ax.set_xticks(range(1, len(feats) + 1), feats)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("avg JCT, feature on / off")
    ax.set_title(f"{len({r['seed'] for r in rows})} generated scenarios, realistic mode")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def seeds_of(text: str) -> list[int]:
    """'1000-1029' or '1,2,5-7' -> the seeds."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder of the runs (resumable)")
    ap.add_argument("--seeds", default=f"{HELD_OUT[0]}-{HELD_OUT[-1]}", help="e.g. 1000-1029 (held out) or 0-29")
    ap.add_argument("--workers", type=int, default=2, help="scenarios simulated at once (one core each)")
    ap.add_argument(
        "--features", default="all", help=f"comma-separated of {', '.join(FEATURES)}; all: {', '.join(ALL)}"
    )
    ap.add_argument(
        "--noise-seeds",
        type=int,
        default=1,
        help="runs per scenario, each under its own truth noise (seed + k x 100000); the ratio pools them",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the scenarios, run nothing")
    args = ap.parse_args(argv)
    features = list(ALL) if args.features == "all" else args.features.split(",")
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        ap.error(f"unknown feature {unknown[0]!r} (known: {', '.join(FEATURES)})")
    scns = [generate(s) for s in seeds_of(args.seeds)]
    if args.dry_run:
        for s in scns:
            print(json.dumps({**asdict(s), "total_gpus": s.total_gpus}))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    rows_all = philly()
    if args.noise_seeds < 1:
        ap.error("--noise-seeds must be at least 1")
    tasks = [(s, k) for s in scns for k in range(args.noise_seeds)]
    with ThreadPoolExecutor(max(1, args.workers)) as pool:
        paths = list(pool.map(lambda t: run(t[0], args.out, features, rows_all, t[1]), tasks))
    docs: dict[int, list[dict]] = {}
    for (s, _), p in zip(tasks, paths, strict=True):
        docs.setdefault(s.seed, []).append(json.loads(p.read_text()))
    rows = [r for s in scns for r in ratios(s, docs[s.seed])]
    for r in rows:
        print(json.dumps(r))
    sums = summary(rows)
    for s in sums:
        print(json.dumps(s))
    (args.out / "scenarios.md").write_text(markdown(rows, sums, sys.argv[1:] if argv is None else argv))
    plot(rows, args.out / "scenarios.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
