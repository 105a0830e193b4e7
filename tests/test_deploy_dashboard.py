"""The Grafana dashboard and the Prometheus scrape example in deploy/: the dashboard imports, and its
PromQL queries (parsed) read only metrics the server exports; the check fails on broken copies; the
scrape example targets the metrics port.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from deploy_manifests import DEPLOY, Manifests, container, port_number

# -- the Grafana dashboard and the Prometheus scrape example -------------------------------------------
# Grafana has no validator that runs offline here, so the dashboard JSON model's fields Grafana needs
# to import a dashboard are asserted (docs: "JSON model"): title, uid, schemaVersion, panels with id,
# type, gridPos on the 24-column grid and targets; the Prometheus data source is a template variable,
# so the file imports as it is, without an __inputs mapping. Every query is parsed as PromQL
# (promql-parser) and every metric it reads must be one TritonMetrics exports.
DASHBOARD = DEPLOY / "grafana" / "specdec.json"


SCRAPE = DEPLOY / "prometheus" / "prometheus.yml"


PANEL_TYPES = {"row", "timeseries", "stat", "gauge", "bargauge", "table"}


# Grafana's interval variables, given a value so that a query parses as PromQL
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


# what the dashboard must chart (the list): tokens/s, TTFT, inter-token latency, acceptance
# overall and per position, mean k chosen, queue depth, KV blocks in use, preemptions, refusals by
# reason, draft failures; the prefix cache's hit rate, cached blocks and evictions
REQUIRED_FAMILIES = {
    "specdec_generated_tokens_total",
    "specdec_time_to_first_token_seconds",
    "specdec_inter_token_latency_seconds",
    "specdec_accepted_tokens_total",
    "specdec_draft_tokens_total",
    "specdec_accepted_per_position_total",
    "specdec_drafted_per_position_total",
    "specdec_planned_draft_tokens_total",
    "specdec_verify_rounds_total",
    "specdec_waiting_sequences",
    "specdec_kv_blocks_used",
    "specdec_preemptions_total",
    "specdec_requests_rejected_total",
    "specdec_draft_failures_total",
    # the prefix cache (issue 40): hit rate per pool, cached blocks, evictions, prompt tokens cached
    "specdec_prefix_cache_hit_tokens_total",
    "specdec_prefix_cache_queried_tokens_total",
    "specdec_kv_blocks_cached",
    "specdec_prefix_cache_evicted_blocks_total",
    "specdec_prompt_cached_tokens_total",
}


def all_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # a collapsed row keeps its panels inside
    return found


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in all_panels(dashboard) for t in p.get("targets", [])]


def metric_families(expr: str, exported: dict[str, str]) -> set[str]:
    """The metric families a PromQL query reads (``x_bucket`` of a histogram ``x`` is ``x``)."""
    import promql_parser

    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    names: list[str] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            names.append(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    families = set()
    for name in names:
        for suffix in HISTOGRAM_SUFFIXES:
            base = name.removesuffix(suffix)
            if base != name and exported.get(base) == "histogram":
                name = base
                break
        families.add(name)
    return families


def check_dashboard(dashboard: dict[str, Any]) -> None:
    from trispec.serving.metrics import exported_metric_names

    exported = exported_metric_names()
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list)):
        assert isinstance(dashboard.get(key), kind), f"dashboard: {key} must be a {kind.__name__}"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"]) and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = all_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == len(ids), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    used: set[str] = set()
    for panel in panels:
        name = panel.get("title", panel["id"])
        assert panel["type"] in PANEL_TYPES, f"{name}: panel type {panel['type']!r}"
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in "hwxy") and grid["x"] + grid["w"] <= 24, name
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{name} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, name
        targets = panel["targets"]
        assert targets and len({t["refId"] for t in targets}) == len(targets), name
        for target in targets:
            assert target["datasource"] == panel["datasource"], name
            families = metric_families(target["expr"], exported)
            unknown = families - exported.keys()
            assert not unknown, f"{name}: {sorted(unknown)} not exported by the model"
            used |= families
    model_query = variables["model"]["query"]["query"]
    found = re.fullmatch(r"label_values\((\w+), model\)", model_query)
    assert found and found.group(1) in exported, model_query
    missing = REQUIRED_FAMILIES - used
    assert not missing, f"the dashboard charts nothing from {sorted(missing)}"


def test_dashboard_imports_and_reads_only_exported_metrics() -> None:
    check_dashboard(json.loads(DASHBOARD.read_text()))


def test_exported_names_come_from_the_metrics_module() -> None:
    """The names the dashboard test trusts are the module's own: a family added there is listed, with
    its kind, and the families made on first use are there too."""
    from trispec.serving.metrics import exported_metric_names

    exported = exported_metric_names()
    assert exported["specdec_time_to_first_token_seconds"] == "histogram"
    assert exported["specdec_requests_rejected_total"] == "counter"  # made on the first refusal
    assert exported["specdec_drafted_per_position_total"] == "counter"  # made on the first draft
    assert exported["specdec_waiting_sequences"] == "gauge"
    assert all(name.startswith("specdec_") for name in exported)


def _rename_metric(d: dict[str, Any]) -> None:
    panel = next(p for p in d["panels"] if p["type"] != "row")
    panel["targets"][0]["expr"] = panel["targets"][0]["expr"].replace("specdec_", "specdec_typo_", 1)


def _drop_refusals(d: dict[str, Any]) -> None:
    d["panels"] = [p for p in d["panels"] if p.get("title") != "Refusals by reason"]


def _bad_promql(d: dict[str, Any]) -> None:
    panel = next(p for p in d["panels"] if p["type"] != "row")
    panel["targets"][0]["expr"] += ")"


@pytest.mark.parametrize(
    "break_it",
    [
        _rename_metric,
        _drop_refusals,
        _bad_promql,
        lambda d: d.pop("uid"),
        lambda d: d["panels"][1]["gridPos"].update(x=20),  # overlaps its neighbour and leaves the grid
        lambda d: d["panels"][1].update(id=d["panels"][0]["id"]),
        lambda d: d["panels"][1].update(datasource={"type": "prometheus", "uid": "my-prometheus"}),
    ],
    ids=[
        "unknown-metric",
        "no-refusals-panel",
        "bad-promql",
        "no-uid",
        "overlap",
        "duplicate-id",
        "fixed-datasource",
    ],
)
def test_dashboard_check_fails_on_a_broken_copy(break_it: Callable[[dict[str, Any]], None]) -> None:
    broken = json.loads(DASHBOARD.read_text())
    break_it(broken)
    with pytest.raises((AssertionError, ValueError, KeyError)):
        check_dashboard(broken)


def test_prometheus_scrape_example_targets_the_metrics_port(manifests: Manifests) -> None:
    from trispec.serving.launcher import parse_args

    config = yaml.safe_load(SCRAPE.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    default_port = parse_args([]).metrics_port
    static = jobs["specdec"]
    assert static["metrics_path"] == "/metrics"
    assert static["static_configs"][0]["targets"] == [f"localhost:{default_port}"]
    # the Kubernetes job keeps exactly the pods the Deployment makes, on the port its annotations name
    pods = jobs["specdec-kubernetes-pods"]
    assert pods["kubernetes_sd_configs"] == [{"role": "pod"}]
    template = manifests["Deployment"]["spec"]["template"]["metadata"]
    annotations = template["annotations"]
    keep = {r["source_labels"][0]: r["regex"] for r in pods["relabel_configs"] if r.get("action") == "keep"}
    name_label = "__meta_kubernetes_pod_label_app_kubernetes_io_name"
    assert keep[name_label] == template["labels"]["app.kubernetes.io/name"]
    assert (
        keep["__meta_kubernetes_pod_annotation_prometheus_io_scrape"] == annotations["prometheus.io/scrape"]
    )
    port = int(annotations["prometheus.io/port"])
    assert port == port_number(container(manifests["Deployment"], "specdec"), "metrics")
    address = next(r for r in pods["relabel_configs"] if r.get("target_label") == "__address__")
    rewritten = re.sub(address["regex"], address["replacement"].replace("$", "\\"), f"10.0.0.7:8000;{port}")
    assert rewritten == f"10.0.0.7:{port}"
