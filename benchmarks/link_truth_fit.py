"""Fit the simulator's link truth (slurm_ext.sim.link_truth) to the
measurements of benchmarks/contention_real.py, and state its error.

Data: benchmarks/results/contention_real.jsonl (sitting 3: each job's model
input, its alone iteration and network seconds, and its measured slowdown)
and the measured slowdowns of sittings 1 and 2 of the same cases
(benchmarks/results/contention_real.md's results table), 27 jobs x 3 = 81
measurements. The truth is given what the simulator gives it (each job's
iteration and network seconds alone at its NICs, from sitting 3, its nodes,
the links' rates and racks) and predicts each job's slowdown; the error of a
prediction is that of the loaded iteration, |predicted - measured| / (1 +
measured), as benchmarks/contention_real.py states solver.network's.

The parameters (GAMMA, BETA, KAPPA) are chosen on a grid by the mean error
over the 81 measurements; leave-one-case-out: for each of the 12 cases, the
parameters fitted on the other 11 predict it, and the mean of those held-out
errors is the truth's error. Prints one JSON line per case and a summary
line; --markdown writes the tables of benchmarks/results/link_truth_fit.md.

    python benchmarks/link_truth_fit.py [--markdown FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from slurm_ext.sim import link_truth
from slurm_ext.sim.link_truth import Links, Params, Talk, loaded_times

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "benchmarks" / "results"
GAMMAS = tuple(i / 4 for i in range(9))  # 0 .. 2
BETAS = tuple(i / 8 for i in range(13))  # 0 .. 1.5
KAPPAS = tuple(i / 2 for i in range(9))  # 0 .. 4


def rows() -> list[dict[str, Any]]:
    """Sitting 3's rows, each with `measured` (sittings 1, 2, 3)."""
    out = [json.loads(line) for line in (RESULTS / "contention_real.jsonl").read_text().splitlines() if line.strip()]
    out = [r for r in out if not r.get("summary")]
    earlier: dict[tuple[str, str], list[float]] = {}
    for line in (RESULTS / "contention_real.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.fullmatch(r"-?[0-9.]+, -?[0-9.]+", cells[9]):
            earlier[cells[0], cells[1]] = [float(x) for x in cells[9].split(",")]
    for r in out:
        r["measured"] = [*earlier[r["case"], r["job"]], r["measured_slowdown"]]
    return out


def geometry() -> dict[str, Any]:
    from contention_real import CASES

    return CASES


def predict(case_rows: list[dict[str, Any]], case: Any, p: Params) -> dict[str, float]:
    """job -> the truth's slowdown in `case` with parameters `p`."""
    net = Links(
        {n: v / 1000 for n, v in case.nic_mbit.items()},
        dict(case.rack_of),
        {r: v / 1000 for r, v in case.uplink_mbit.items()},
    )
    talks = {r["job"]: Talk(tuple(r["nodes"]), r["model_input_s"], r["model_input_net_s"]) for r in case_rows}
    loaded = loaded_times(talks, net, p)
    return {j: loaded[j] / loaded_times({j: t}, net, p)[j] - 1 for j, t in talks.items()}


def err(pred: float, measured: float) -> float:
    return abs(pred - measured) / (1 + measured)


def case_errors(by_case: dict[str, list[dict[str, Any]]], cases: Any, p: Params) -> dict[str, list[float]]:
    out = {}
    for name, rs in by_case.items():
        pred = predict(rs, cases[name], p)
        out[name] = [err(pred[r["job"]], m) for r in rs for m in r["measured"]]
    return out


def fit(table: dict[Params, dict[str, list[float]]], cases: list[str]) -> Params:
    def score(p: Params) -> float:
        return statistics.mean(e for c in cases for e in table[p][c])

    return min(table, key=score)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--markdown", type=Path, help="write the result tables here")
    a = ap.parse_args()
    data, cases = rows(), geometry()
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in data:
        by_case.setdefault(r["case"], []).append(r)
    grid = [Params(g, b, k) for g, b, k in itertools.product(GAMMAS, BETAS, KAPPAS)]
    table = {p: case_errors(by_case, cases, p) for p in grid}
    names = list(by_case)
    best = fit(table, names)
    shipped = Params()
    held: dict[str, list[float]] = {}
    lines = []
    for name in names:
        p = fit(table, [c for c in names if c != name])
        held[name] = table[p][name]
        pred_held, pred_all = predict(by_case[name], cases[name], p), predict(by_case[name], cases[name], shipped)
        for r in by_case[name]:
            lines.append(
                {
                    "case": name,
                    "job": r["job"],
                    "measured": r["measured"],
                    "solver_network": r["model_slowdown"],
                    "truth": round(pred_all[r["job"]], 4),
                    "truth_held_out": round(pred_held[r["job"]], 4),
                    "held_out_params": [p.gamma, p.beta, p.kappa],
                }
            )
    model_err = [err(r["model_slowdown"], m) for r in data for m in r["measured"]]
    maxmin_err = [err(r["maxmin_slowdown"], m) for r in data for m in r["measured"]]
    shipped_err = [e for c in names for e in table.get(shipped, case_errors(by_case, cases, shipped))[c]]
    held_err = [e for c in names for e in held[c]]
    summary = {
        "summary": True,
        "measurements": len(model_err),
        "best_params": [best.gamma, best.beta, best.kappa],
        "shipped_params": [shipped.gamma, shipped.beta, shipped.kappa],
        "truth_in_sample_mean_rel_err": round(statistics.mean(shipped_err), 4),
        "truth_in_sample_max_rel_err": round(max(shipped_err), 4),
        "truth_leave_one_case_out_mean_rel_err": round(statistics.mean(held_err), 4),
        "truth_leave_one_case_out_max_rel_err": round(max(held_err), 4),
        "solver_network_mean_rel_err": round(statistics.mean(model_err), 4),
        "solver_network_max_rel_err": round(max(model_err), 4),
        "maxmin_variant_mean_rel_err": round(statistics.mean(maxmin_err), 4),
    }
    for line in [*lines, summary]:
        print(json.dumps(line))
    if a.markdown:
        a.markdown.write_text(markdown(lines, summary))
    return 0 if summary["best_params"] == summary["shipped_params"] else 1


def markdown(lines: list[dict[str, Any]], s: dict[str, Any]) -> str:
    out = [
        "| case | job | measured (sittings 1, 2, 3) | solver.network | link truth | link truth, case held out |",
        "|---|---|---|---|---|---|",
    ]
    for r in lines:
        m = ", ".join(f"{x:.2f}" for x in r["measured"])
        out.append(
            f"| {r['case']} | {r['job']} | {m} | {r['solver_network']:.2f} | {r['truth']:.2f} | "
            f"{r['truth_held_out']:.2f} |"
        )
    out += [
        "",
        "| loaded iteration, relative error over the 81 measurements | mean | max |",
        "|---|---|---|",
        f"| solver.network (sitting 3's predictions) | {s['solver_network_mean_rel_err']:.1%} | "
        f"{s['solver_network_max_rel_err']:.1%} |",
        f"| max-min variant of contention_real.py | {s['maxmin_variant_mean_rel_err']:.1%} | |",
        f"| link truth, fitted on all cases | {s['truth_in_sample_mean_rel_err']:.1%} | "
        f"{s['truth_in_sample_max_rel_err']:.1%} |",
        f"| link truth, leave-one-case-out | {s['truth_leave_one_case_out_mean_rel_err']:.1%} | "
        f"{s['truth_leave_one_case_out_max_rel_err']:.1%} |",
        "",
    ]
    return "\n".join(out)


_ = link_truth  # the module fitted

if __name__ == "__main__":
    sys.exit(main())
