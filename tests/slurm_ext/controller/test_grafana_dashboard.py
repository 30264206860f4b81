"""slurm_ext/admin/grafana/cellsched.json queries only what the controller exports.

The exported metrics come from the real thing: a Metrics registry that the
real controller writes to while the simulator runs a few rounds on a small
cluster (places jobs, runs them), then one round with Slurm away (an error).
Its exposition text (`Metrics.render`) gives the metric names (`# TYPE`
lines); every series the controller wrote gives the label names and values.
Every PromQL expression of the dashboard (all panels, rows' nested panels
included, and the template variables' queries) must name only those metrics,
and use only their labels (and the labels Prometheus adds at scrape time).
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import UnitSpeed

from slurm_ext.backends import SlurmUnavailable
from slurm_ext.config import from_dict
from slurm_ext.controller import metrics as mx
from slurm_ext.controller.round import Controller
from slurm_ext.sim import engine
from slurm_ext.sim.engine import SimOptions, Simulator
from slurm_ext.sim.types import ClusterSpec, NodeGroup, TraceJob

DASHBOARD = Path(__file__).resolve().parents[3] / "slurm_ext" / "admin" / "grafana" / "cellsched.json"
DATASOURCE_VAR = "${DS_PROMETHEUS}"
TARGET_LABELS = frozenset({"instance", "job"})  # added by Prometheus when it scrapes

# --- the controller's exposition ----------------------------------------------


@dataclass
class Exported:
    """Metric names as exposed, and the labels (name -> values) of each."""

    names: set[str]
    labels: dict[str, dict[str, set[str]]] = field(default_factory=dict)


class Recording(mx.Metrics):
    """The real registry, noting every series the controller writes."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, set[mx.Labels]] = defaultdict(set)

    def _note(self, name: str, labels: Mapping[str, str] | None) -> None:
        self.seen[name].add(tuple(sorted((k, str(v)) for k, v in (labels or {}).items())))

    def set(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        self._note(name, labels)
        super().set(name, value, labels)

    def inc(self, name: str, by: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        self._note(name, labels)
        super().inc(name, by, labels)

    def replace(self, name: str, values: Mapping[mx.Labels, float]) -> None:
        for key in values:
            self._note(name, dict(key))
        super().replace(name, values)


class _SlurmAway:
    name = "away"

    def observe(self):
        raise SlurmUnavailable("slurmctld is down")


def exported_by(text: str) -> set[str]:
    """The metric names a Prometheus exposition text exposes: its `# TYPE`
    families (a histogram as its _bucket/_sum/_count series, a summary as
    itself and its _sum/_count) and the name of every sample line."""
    names: set[str] = set()
    for line in text.splitlines():
        if m := re.fullmatch(r"# TYPE (\S+) (\w+)", line):
            name, kind = m.groups()
            suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}
            names.update(name + s for s in suffixes.get(kind, ("",)))
        elif line and not line.startswith("#"):
            names.add(re.match(r"[A-Za-z_:][\w:]*", line)[0])
    return names


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Exported:
    m = Recording()
    trace = [
        TraceJob("a", 100.0, "bert__760M", 64, 50, 4, "a100"),
        TraceJob("b", 110.0, "bert__760M", 64, 50, 8, "a100"),  # waits for a
    ]
    cluster = ClusterSpec((NodeGroup("a100", 1, 8), NodeGroup("v100", 1, 4)))
    options = SimOptions(restart_per_gpu_s=0.0, restart_max_s=0.0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "Controller", functools.partial(Controller, metrics=m))
        Simulator(trace, cluster, "fcfs", speed=UnitSpeed().speed, estimator=UnitSpeed(), options=options).run()
    config = from_dict({"controller": {"state_path": str(tmp_path_factory.mktemp("state") / "s.sqlite")}})
    ctl = Controller(config, backend=_SlurmAway(), metrics=m)
    try:
        ctl.round(dry_run=True)
    finally:
        ctl.state.close()

    text = m.render()
    labels: dict[str, dict[str, set[str]]] = {}
    for name, series in m.seen.items():
        values = labels.setdefault(m.prefix + name, {})
        for key in series:
            for k, v in key:
                values.setdefault(k, set()).add(v)
    return Exported(exported_by(text), labels)


def test_the_sample_covers_every_declared_metric(exported):
    """Every metric with labels got series in the sample, so its labels and their values are known."""
    for name in ("rounds_total", "round_phase_seconds", "jobs", "gpus", "actions_total", "errors_total"):
        assert exported.labels["cellsched_" + name], name
    assert {"total", "used", "managed"} <= exported.labels["cellsched_gpus"]["use"]
    assert "cellsched_rounds_total" in exported.names and "cellsched_gpus" in exported.names


def test_exported_by_reads_types_and_histogram_suffixes():
    text = (
        "# TYPE a_seconds histogram\n"
        'a_seconds_bucket{le="1"} 0\n'
        "# TYPE b_total counter\n"
        "b_total 1\n"
        "# TYPE c summary\n"
        "# TYPE d gauge\n"
    )
    assert exported_by(text) == {
        "a_seconds_bucket",
        "a_seconds_sum",
        "a_seconds_count",
        "b_total",
        "c",
        "c_sum",
        "c_count",
        "d",
    }


# --- PromQL, as far as the dashboard needs it --------------------------------

AGGREGATIONS = frozenset(
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio".split()
)
FUNCTIONS = AGGREGATIONS | frozenset(
    """abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week
    day_of_year days_in_month delta deriv exp floor histogram_avg histogram_count histogram_fraction
    histogram_quantile histogram_stddev histogram_stdvar histogram_sum holt_winters hour idelta increase
    irate label_join label_replace ln log10 log2 minute month predict_linear rate resets round scalar sgn
    sort sort_desc sort_by_label sort_by_label_desc sqrt time timestamp vector year avg_over_time
    min_over_time max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time
    stdvar_over_time last_over_time present_over_time mad_over_time acos acosh asin asinh atan atanh cos cosh
    sin sinh tan tanh deg pi rad""".split()
)
KEYWORDS = frozenset("by without on ignoring group_left group_right and or unless bool offset inf nan atan2".split())

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_IDENT = r"[A-Za-z_][\w]*"
_MATCHER = re.compile(rf'\s*({_IDENT})\s*(=~|!~|!=|=)\s*"(\d+)"\s*(?:,|$)')


@dataclass
class Query:
    metrics: set[str] = field(default_factory=set)
    matchers: list[tuple[str, str, str, str]] = field(default_factory=list)  # metric, label, op, value
    grouping: set[str] = field(default_factory=set)  # labels of by/without/on/ignoring/group_x clauses
    by: set[str] = field(default_factory=set)  # labels of by clauses (what an aggregation keeps)
    without: set[str] = field(default_factory=set)  # labels of without clauses (what an aggregation drops)
    aggregates: bool = False  # an aggregation (sum, max, ...): only its by labels are left
    problems: list[str] = field(default_factory=list)


def parse(expr: str) -> Query:
    """The metric names, label matchers and grouping labels of a PromQL
    expression; what it cannot read goes to `problems`."""
    q = Query()
    strings: list[str] = []

    def keep(m: re.Match) -> str:
        strings.append(m[0][1:-1])
        return f'"{len(strings) - 1}"'

    s = _STRING.sub(keep, expr)

    def selector(m: re.Match) -> str:
        metric, body = m[1], m[2]
        if not metric:
            q.problems.append(f"a selector without a metric name: {{{body}}}")
        pos = 0
        while pos < len(body.rstrip()):
            mm = _MATCHER.match(body, pos)
            if not mm:
                q.problems.append(f"cannot read the matchers {{{body}}}")
                break
            q.matchers.append((metric, mm[1], mm[2], strings[int(mm[3])]))
            pos = mm.end()
        return f"{metric} "

    s = re.sub(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}", selector, s)

    def grouping(m: re.Match) -> str:
        labels = {x.strip() for x in (m[3] or "").split(",") if x.strip()}
        for x in labels:
            if not re.fullmatch(_IDENT, x):
                q.problems.append(f"not a label name in {m[1]}(...): {x!r}")
        q.grouping |= labels
        if m[1] in ("by", "without"):
            getattr(q, m[1]).update(labels)
        return " "

    s = re.sub(r"(?<![\w:])(by|without|on|ignoring|group_left|group_right)(?![\w:])\s*(\(([^()]*)\))?", grouping, s)
    s = re.sub(r"\[[^\[\]]*\]", " ", s)  # range and subquery durations ($__rate_interval, 5m, 1h:1m)
    s = re.sub(r'"\d+"', " ", s)  # string arguments (label_replace, count_values)
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", s):
        name, call = m[1], m[2]
        if call:
            if name not in FUNCTIONS:
                q.problems.append(f"unknown function {name}()")
            q.aggregates |= name in AGGREGATIONS
        elif name not in KEYWORDS:
            q.metrics.add(name)
    if "$" in s or "{" in s or "}" in s:
        q.problems.append(f"cannot read {expr!r}")
    return q


def check(expr: str, exported: Exported, legend: str = "") -> list[str]:
    """What is wrong with one query of the dashboard (empty: nothing)."""
    q = parse(expr)
    problems = list(q.problems)
    if not q.metrics:
        problems.append(f"no metric in {expr!r}")
    for name in sorted(q.metrics - exported.names):
        problems.append(f"{name} is not exported by the controller ({expr!r})")
    known = {n: exported.labels.get(n, {}) for n in q.metrics & exported.names}
    carried = set().union(*known.values()) | TARGET_LABELS
    for metric, label, op, value in q.matchers:
        labels = exported.labels.get(metric, {})
        if label in TARGET_LABELS:
            continue
        if label not in labels:
            problems.append(f"{metric} has no label {label!r} ({expr!r})")
        elif op in ("=", "!=") and "$" not in value and value not in labels[label]:
            problems.append(f"{metric}{{{label}={value!r}}}: the controller writes only {sorted(labels[label])}")
    for label in sorted(q.grouping - carried):
        problems.append(f"no metric of {expr!r} has the label {label!r}")
    kept = carried  # what is left for the legend: an aggregation keeps its by labels, or all but its without ones
    if q.aggregates:
        kept = q.by if q.by else carried - q.without if q.without else set()
    for label in sorted(set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)) - kept):
        problems.append(f"the legend {legend!r} shows {label!r}, which {expr!r} does not keep")
    return problems


def test_parse_reads_metric_names_and_labels():
    q = parse(
        'histogram_quantile(0.9, sum by (le, job) (rate(a_seconds_bucket{x="1",y=~"$v|b"}[$__rate_interval])))'
        " / ignoring (x) group_left (y) b_total offset 1h and on() vector(1e3) > bool inf"
    )
    assert q.problems == []
    assert q.metrics == {"a_seconds_bucket", "b_total"}
    assert q.matchers == [("a_seconds_bucket", "x", "=", "1"), ("a_seconds_bucket", "y", "=~", "$v|b")]
    assert q.grouping == {"le", "job", "x", "y"} and q.by == {"le", "job"}
    assert parse('label_replace(up, "d", "$1", "s", "(.*)")').metrics == {"up"}


def test_check_catches_what_the_controller_does_not_export(exported):
    assert check("sum by (gpu_type) (cellsched_gpus{use='used'})", exported, "{{gpu_type}}") == []
    bad = {
        "sum(rate(cellsched_rounds_totl[5m]))": "cellsched_rounds_totl is not exported",
        "cellsched_round_duration_seconds_bucket": "is not exported",
        "rate(cellsched_actions[5m])": "cellsched_actions is not exported",
        "rates(cellsched_actions_total[5m])": "unknown function rates()",
        'cellsched_gpus{type="a100"}': "has no label 'type'",
        'cellsched_gpus{use="usage"}': "the controller writes only",
        "sum by (type) (cellsched_gpus)": "has the label 'type'",
        "sum(cellsched_jobs)": "does not keep",  # with the legend {{phase}}
        "{__name__=~'cellsched_.*'}": "without a metric name",
    }
    for expr, why in bad.items():
        problems = check(expr, exported, "{{phase}}" if expr == "sum(cellsched_jobs)" else "")
        assert any(why in p for p in problems), (expr, problems)


# --- the dashboard -----------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list[dict]) -> Iterator[dict]:
    """Every panel, and the panels nested in (collapsed) rows."""
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def test_the_dashboard_is_a_grafana_dashboard(dashboard):
    assert dashboard["title"] == "cellsched controller" and dashboard["uid"]
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = list(all_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    assert any(p.get("panels") for p in panels if p["type"] == "row"), "a collapsed row keeps its panels nested"
    for p in panels:
        pos = p["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": DATASOURCE_VAR}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == {"type": "prometheus", "uid": DATASOURCE_VAR}, p["title"]
            assert t["expr"].strip(), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == DATASOURCE_VAR, v["name"]


def dashboard_queries(dashboard: dict) -> Iterator[tuple[str, str, str]]:
    """(where, expr, legend) of every query: panel targets, then the query
    variables (a `label_values(metric, label)` gives `sum by (label) (metric)`)."""
    for p in all_panels(dashboard["panels"]):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t['refId']}", t["expr"], t.get("legendFormat", "")
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            if m := re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\s*\)\s*", query):
                query = f"sum by ({m[2]}) ({m[1]})"
            yield f"variable {v['name']!r}", query, ""


def test_every_query_names_only_exported_metrics_and_labels(dashboard, exported):
    problems = [
        f"{where}: {p}" for where, expr, legend in dashboard_queries(dashboard) for p in check(expr, exported, legend)
    ]
    assert not problems, "\n".join(problems)


def test_the_dashboard_shows_the_controllers_metrics(dashboard, exported):
    """Every metric the controller exports is on the dashboard (a new one
    needs a panel in slurm_ext/admin/grafana/cellsched.json)."""
    used = set().union(*(parse(expr).metrics for _, expr, _ in dashboard_queries(dashboard)))
    assert not exported.names - used, f"not on the dashboard: {sorted(exported.names - used)}"
