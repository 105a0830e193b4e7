"""deploy/: the Dockerfile and the Kubernetes manifests, checked offline.

No image is built and no cluster is contacted. Every manifest is validated against the Kubernetes
OpenAPI schemas bundled in kubernetes-validate, in strict mode (unknown fields fail), for Kubernetes
1.32 and 1.37; then the settings specdec depends on are asserted
(GPU request, probes, /dev/shm, labels shared by Deployment/Service/PDB, the HPA's metric, the YAML in
the ConfigMap through our own config loader, the Dockerfile's base image and install). Each check is
also run on a deliberately broken copy, to show that it fails there.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from trispec.config import SpecDecConfig, parse_config
from trispec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
BASE_IMAGE = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
# two schema versions bundled in kubernetes-validate 1.37.0 (it carries 1.25 onwards): the oldest
# Kubernetes still commonly run and the newest
KUBERNETES_VERSIONS = ("1.32", "1.37")
MANIFEST_FILES = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
# Kubernetes resource quantities (the schemas only say "string or integer")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")

Manifests = dict[str, dict[str, Any]]


def load_manifests() -> Manifests:
    """Each file of deploy/k8s holds one resource; keyed by kind."""
    found: Manifests = {}
    for name in MANIFEST_FILES:
        docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]
        assert len(docs) == 1, f"{name}: expected one resource, found {len(docs)}"
        kind = docs[0]["kind"]
        assert kind not in found, f"two {kind} manifests"
        found[kind] = docs[0]
    return found


@pytest.fixture
def manifests() -> Manifests:
    return load_manifests()


# -- helpers -------------------------------------------------------------------------------------------


def pod_spec(resource: dict[str, Any]) -> dict[str, Any]:
    return resource["spec"]["template"]["spec"]


def container(resource: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [c for c in pod_spec(resource)["containers"] if c["name"] == name]
    assert len(matches) == 1, f"no container {name!r}"
    return matches[0]


def command_line(c: dict[str, Any]) -> str:
    return shlex.join([*c.get("command", []), *c.get("args", [])])


def flag(c: dict[str, Any], name: str) -> str:
    """The value after ``name`` in the container's args."""
    args = c.get("args", [])
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
    assert port in named, f"port {port!r} is not a named port of container {c['name']!r}"
    return named[port]


def mount(resource: dict[str, Any], c: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volumeMount, volume) for the mount at ``path``."""
    mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == path]
    assert len(mounts) == 1, f"{c['name']}: nothing mounted at {path}"
    volumes = {v["name"]: v for v in pod_spec(resource).get("volumes", [])}
    assert mounts[0]["name"] in volumes, f"volume {mounts[0]['name']!r} is not defined"
    return mounts[0], volumes[mounts[0]["name"]]


def specdec_config(m: Manifests) -> SpecDecConfig:
    return parse_config(yaml.safe_load(m["ConfigMap"]["data"]["specdec.yaml"]))


def probe_window_s(probe: dict[str, Any]) -> int:
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def build_stamp(c: dict[str, Any]) -> str:
    """The shell expression for the engines' stamp (config + TensorRT-LLM version) in a container."""
    found = re.search(r'stamp="\$\((.+?)\)";', command_line(c))
    assert found, f"{c['name']}: no stamp= in its command"
    assert "/config/specdec.yaml" in found.group(1)
    return found.group(1)


def check_quantities(resource: dict[str, Any]) -> None:
    for c in pod_spec(resource)["containers"] + pod_spec(resource).get("initContainers", []):
        for section in ("requests", "limits"):
            for key, value in c.get("resources", {}).get(section, {}).items():
                assert QUANTITY.match(str(value)), f"{c['name']}: {section}.{key} {value!r} is no quantity"


# -- checks (each also run on a broken copy below) -----------------------------------------------------


def check_deployment(m: Manifests) -> None:
    dep = m["Deployment"]
    config = specdec_config(m)
    assert config.trtllm is not None
    spec, pod = dep["spec"], pod_spec(dep)
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    assert spec.get("replicas", 1) == 1
    c = container(dep, "specdec")
    assert c["image"] == "specdec"

    # one GPU per TensorRT-LLM rank, requested and limited alike
    gpus = config.trtllm.tp_size
    assert c["resources"]["limits"].get("nvidia.com/gpu") == gpus
    assert c["resources"]["requests"].get("nvidia.com/gpu") == gpus
    check_quantities(dep)

    # ports, and the same ports on specdec-serve's command line
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert command_line(c).startswith("specdec-serve ")
    assert flag(c, "--host") == "0.0.0.0"
    for option, name in (("--http-port", "http"), ("--grpc-port", "grpc"), ("--metrics-port", "metrics")):
        assert int(flag(c, option)) == ports[name]

    # probes: Triton's health endpoints on the HTTP port
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_number(c, get["port"]) == 8000, probe
    startup = c["startupProbe"]
    assert startup["httpGet"]["path"] == "/v2/health/ready"
    assert port_number(c, startup["httpGet"]["port"]) == 8000
    # the engines load for minutes: the startup window must outlast the server's own ready timeout, and
    # liveness must not kill a supervisor restart that is still within that timeout
    ready_timeout = float(flag(c, "--ready-timeout"))
    assert probe_window_s(startup) > ready_timeout
    assert probe_window_s(c["livenessProbe"]) > ready_timeout
    assert c["readinessProbe"].get("failureThreshold", 3) <= 3

    # shutdown: preStop + Triton's --exit-timeout fit in the grace period
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(flag(c, "--exit-timeout")) + int(pre_stop[1])

    # volumes
    _, shm = mount(dep, c, "/dev/shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert QUANTITY.match(shm["emptyDir"]["sizeLimit"])
    config_mount, config_volume = mount(dep, c, "/config")
    assert config_mount.get("readOnly") is True
    assert config_volume["configMap"]["name"] == m["ConfigMap"]["metadata"]["name"]
    assert flag(c, "--config") == "/config/specdec.yaml"
    engines_mount, engines = mount(dep, c, "/engines")
    assert engines_mount.get("readOnly") is True
    assert engines["persistentVolumeClaim"]["claimName"] == m["PersistentVolumeClaim"]["metadata"]["name"]
    assert str(config.trtllm.engines_dir) == "/engines"
    models_mount, models = mount(dep, c, "/models")
    assert not models_mount.get("readOnly") and "emptyDir" in models
    assert flag(c, "--model-repository") == "/models"

    # Prometheus scrapes Triton's metrics port
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    assert annotations["prometheus.io/path"] == "/metrics"

    assert pod["securityContext"]["runAsNonRoot"] is True
    # the init container waits for the stamp the build Job writes, computed the same way
    (wait,) = pod["initContainers"]
    assert "/engines/BUILD_COMPLETE" in command_line(wait)
    assert build_stamp(wait) == build_stamp(container(m["Job"], "build"))
    assert mount(dep, wait, "/config")[1] == config_volume


def check_service(m: Manifests) -> None:
    svc, dep = m["Service"], m["Deployment"]
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    c = container(dep, "specdec")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert {name: p["port"] for name, p in ports.items()} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    for p in ports.values():
        assert port_number(c, p["targetPort"]) == p["port"]


def check_pdb(m: Manifests) -> None:
    pdb, dep = m["PodDisruptionBudget"], m["Deployment"]
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    # minAvailable: 1 would block every drain of a single replica's node
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["maxUnavailable"] == 1


def exported_gauges() -> set[str]:
    """The gauge names our Triton metrics really create (through a recording MetricFamily)."""
    import types

    from trispec.serving.metrics import TritonMetrics

    made: dict[str, str] = {}

    class Family:
        COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

        def __init__(self, name: str, description: str, kind: str) -> None:
            made[name] = kind

        def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> object:
            return types.SimpleNamespace(set=lambda v: None, increment=lambda v: None, observe=lambda v: None)

    TritonMetrics(types.SimpleNamespace(MetricFamily=Family), "specdec")  # type: ignore[arg-type]
    return {name for name, kind in made.items() if kind == "gauge"}


def check_hpa(m: Manifests) -> None:
    hpa, dep = m["HorizontalPodAutoscaler"], m["Deployment"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        dep["apiVersion"],
        "Deployment",
        dep["metadata"]["name"],
    )
    assert 1 == hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "specdec_waiting_sequences"
    assert "specdec_waiting_sequences" in exported_gauges()
    assert metric["pods"]["target"]["type"] == "AverageValue"
    assert QUANTITY.match(str(metric["pods"]["target"]["averageValue"]))
    scale_down = hpa["spec"]["behavior"]["scaleDown"]
    assert scale_down["stabilizationWindowSeconds"] >= 300
    assert all(p["periodSeconds"] >= 60 for p in scale_down["policies"])


def check_build_job(m: Manifests) -> None:
    job, dep = m["Job"], m["Deployment"]
    c = container(job, "build")
    assert "specdec-build --config /config/specdec.yaml" in command_line(c)
    assert 'echo "${stamp}" > /engines/BUILD_COMPLETE' in command_line(c)
    assert "ttlSecondsAfterFinished" not in job["spec"]  # the finished Job stays: re-applying is a no-op
    assert c["image"] == container(dep, "specdec")["image"]
    assert c["resources"]["limits"].get("nvidia.com/gpu", 0) >= 1
    check_quantities(job)
    assert pod_spec(job)["restartPolicy"] == "Never"
    engines_mount, engines = mount(job, c, "/engines")
    assert not engines_mount.get("readOnly")
    assert engines["persistentVolumeClaim"]["claimName"] == m["PersistentVolumeClaim"]["metadata"]["name"]
    _, config_volume = mount(job, c, "/config")
    assert config_volume["configMap"]["name"] == m["ConfigMap"]["metadata"]["name"]
    # the build pod must not count as a server replica (Service endpoints, PDB, HPA)
    selector = dep["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()


def check_config(m: Manifests) -> None:
    config = specdec_config(m)  # our own loader: raises ConfigError on any bad key or value
    trt = config.trtllm
    assert config.engine.kind == "trtllm" and trt is not None
    assert trt.gpu_ids == list(range(trt.tp_size))  # the container sees its GPUs from 0
    assert trt.max_batch_size >= config.scheduler.max_batch_size
    hf_export = trt.engines_dir / "hf"  # where specdec-build writes its HF copies
    models = [config.target] + ([config.drafter.model] if config.drafter.model else [])
    for model in models:
        path = model.checkpoint.path
        assert path is not None and path.is_relative_to(trt.engines_dir), path
        assert not path.is_relative_to(hf_export), f"{path}: the build would export onto its own source"


CHECKS: dict[str, Callable[[Manifests], None]] = {
    "deployment": check_deployment,
    "service": check_service,
    "pdb": check_pdb,
    "hpa": check_hpa,
    "build-job": check_build_job,
    "config": check_config,
}


@pytest.mark.parametrize("name", CHECKS)
def test_manifest_settings(manifests: Manifests, name: str) -> None:
    CHECKS[name](manifests)


# -- schema validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", MANIFEST_FILES)
def test_manifest_validates_strictly(name: str, version: str) -> None:
    (resource,) = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]
    assert kubernetes_validate.validate(resource, version, strict=True) == version


def test_kustomization_lists_every_manifest(manifests: Manifests) -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == MANIFEST_FILES
    images = {
        c["image"]
        for kind in ("Deployment", "Job")
        for c in pod_spec(manifests[kind])["containers"] + pod_spec(manifests[kind]).get("initContainers", [])
    }
    assert images == {entry["name"] for entry in kustomization["images"]}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) not installed")
def test_kustomize_renders() -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    resources = [d for d in yaml.safe_load_all(rendered) if d is not None]
    assert sorted(r["kind"] for r in resources) == sorted(load_manifests())
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    for r in resources:
        if r["kind"] in ("Deployment", "Job"):
            for c in pod_spec(r)["containers"] + pod_spec(r).get("initContainers", []):
                assert c["image"] == f"{image['newName']}:{image['newTag']}"


# -- the checks fail on broken copies ----------------------------------------------------------------------


def _drop_gpu(m: Manifests) -> None:
    resources = container(m["Deployment"], "specdec")["resources"]
    del resources["limits"]["nvidia.com/gpu"], resources["requests"]["nvidia.com/gpu"]


def _probe_on_metrics_port(m: Manifests) -> None:
    container(m["Deployment"], "specdec")["livenessProbe"]["httpGet"]["port"] = "metrics"


def _short_startup(m: Manifests) -> None:
    container(m["Deployment"], "specdec")["startupProbe"]["failureThreshold"] = 6


def _no_shm(m: Manifests) -> None:
    c = container(m["Deployment"], "specdec")
    c["volumeMounts"] = [v for v in c["volumeMounts"] if v["mountPath"] != "/dev/shm"]


def _init_waits_for_any_build(m: Manifests) -> None:
    (wait,) = pod_spec(m["Deployment"])["initContainers"]
    wait["args"][-1] = "until [ -f /engines/BUILD_COMPLETE ]; do sleep 20; done"


def _pdb_other_labels(m: Manifests) -> None:
    m["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] = {"app": "specdec"}


def _hpa_cpu(m: Manifests) -> None:
    m["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]["name"] = "cpu_usage"


def _no_grpc_port(m: Manifests) -> None:
    ports = m["Service"]["spec"]["ports"]
    m["Service"]["spec"]["ports"] = [p for p in ports if p["name"] != "grpc"]


def _job_as_server(m: Manifests) -> None:
    labels = m["Job"]["spec"]["template"]["metadata"]["labels"]
    labels.update(m["Deployment"]["spec"]["selector"]["matchLabels"])


def _torch_engine(m: Manifests) -> None:
    data = yaml.safe_load(m["ConfigMap"]["data"]["specdec.yaml"])
    data["engine"]["kind"] = "torch"
    m["ConfigMap"]["data"]["specdec.yaml"] = yaml.safe_dump(data)


def _two_gpus_in_yaml(m: Manifests) -> None:
    data = yaml.safe_load(m["ConfigMap"]["data"]["specdec.yaml"])
    data["trtllm"].update(tp_size=2, gpu_ids=[0, 1])  # the Deployment still asks for one GPU
    m["ConfigMap"]["data"]["specdec.yaml"] = yaml.safe_dump(data)


def _config_typo(m: Manifests) -> None:
    data = yaml.safe_load(m["ConfigMap"]["data"]["specdec.yaml"])
    data["scheduler"]["max_num_draft_token"] = data["scheduler"].pop("max_num_draft_tokens")
    m["ConfigMap"]["data"]["specdec.yaml"] = yaml.safe_dump(data)


def _source_in_export_dir(m: Manifests) -> None:
    data = yaml.safe_load(m["ConfigMap"]["data"]["specdec.yaml"])
    data["target"]["checkpoint"]["path"] = "/engines/hf/target"
    m["ConfigMap"]["data"]["specdec.yaml"] = yaml.safe_dump(data)


@pytest.mark.parametrize(
    ("check", "break_it"),
    [
        ("deployment", _drop_gpu),
        ("deployment", _probe_on_metrics_port),
        ("deployment", _short_startup),
        ("deployment", _no_shm),
        ("deployment", _two_gpus_in_yaml),
        ("deployment", _init_waits_for_any_build),
        ("pdb", _pdb_other_labels),
        ("hpa", _hpa_cpu),
        ("service", _no_grpc_port),
        ("build-job", _job_as_server),
        ("config", _torch_engine),
        ("config", _config_typo),
        ("config", _source_in_export_dir),
    ],
    ids=lambda x: x if isinstance(x, str) else x.__name__.lstrip("_"),
)
def test_checks_fail_on_a_broken_copy(check: str, break_it: Callable[[Manifests], None]) -> None:
    broken = copy.deepcopy(load_manifests())
    break_it(broken)
    with pytest.raises((AssertionError, ConfigError)):
        CHECKS[check](broken)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "template", "spec", "containers", 0, "readinesProbe"), {}),  # a typo: unknown field
        (("spec", "template", "spec", "containers", 0, "ports", 0, "containerPort"), "8000"),  # wrong type
        (("spec", "template", "spec", "terminationGracePeriod"), 60),
    ],
)
def test_strict_validation_rejects_a_broken_deployment(path: tuple[Any, ...], value: object) -> None:
    resource = copy.deepcopy(load_manifests()["Deployment"])
    node = resource
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(resource, KUBERNETES_VERSIONS[0], strict=True)


# -- Dockerfile -------------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined; heredoc bodies are skipped."""
    instructions: list[tuple[str, str]] = []
    lines = iter(DOCKERFILE.read_text().splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\"):
            following = next(lines)
            if following.lstrip().startswith("#"):
                continue
            line = line[:-1] + " " + following.strip()
        heredoc = re.search(r"<<-?'?(\w+)'?", line)
        if heredoc:
            for body in lines:
                if body.strip() == heredoc.group(1):
                    break
        word, _, rest = line.strip().partition(" ")
        instructions.append((word.upper(), rest.strip()))
    return instructions


def test_dockerfile_base_image_and_install() -> None:
    instructions = dockerfile_instructions()
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    (base,) = [rest for word, rest in instructions if word == "FROM"]
    assert base in (BASE_IMAGE, "${BASE_IMAGE}")
    assert args.get("BASE_IMAGE", BASE_IMAGE) == BASE_IMAGE

    env = " ".join(rest for word, rest in instructions if word == "ENV")
    assert "SPECDEC_TRITONSERVER_ROOT=/opt/tritonserver" in env
    runs = [rest for word, rest in instructions if word == "RUN"]
    text = DOCKERFILE.read_text()
    # TensorRT-LLM 1.2.x checked at build time, and the unverified pin said so
    assert "import tensorrt_llm; print(tensorrt_llm.__version__)" in text
    assert "1.2.*)" in text and "exit 1" in text
    assert "not verified" in text.lower()

    # our package without its (CPU) dependency list, then only the light runtime dependencies
    assert any("pip install --no-deps ." in run for run in runs)
    installs = [run for run in runs if "pip install" in run]
    for light in ("safetensors", "tokenizers", "gguf", "pyyaml", "pydantic>=2.5", "jinja2", "rich"):
        assert any(light in run for run in installs), light
    for heavy in ("torch", "numpy", "nvidia-pytriton", "tritonclient"):
        assert not any(re.search(rf"[\s\"']{heavy}\b", run) for run in installs), heavy

    # what the install needs is copied, and exists
    copied = [rest for word, rest in instructions if word == "COPY"]
    for needed in ("README.md", "pyproject.toml", "setup.py", "python_backend/", "build_engines/", "client/"):
        assert any(needed in line.split() for line in copied), needed
        assert (ROOT / needed).exists(), needed

    expose = [rest for word, rest in instructions if word == "EXPOSE"]
    assert expose == ["8000 8001 8002"]
    users = [rest for word, rest in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")  # the last one is what runs


def test_dockerfile_cmd_matches_the_deployment(manifests: Manifests) -> None:
    (cmd,) = [rest for word, rest in dockerfile_instructions() if word == "CMD"]
    cmd_args = yaml.safe_load(cmd)  # exec form: a JSON array
    assert cmd_args[:2] == ["specdec-serve", "--config"]
    assert " ".join(cmd_args[cmd_args.index("--host") :]).endswith(
        "0.0.0.0 --http-port 8000 --grpc-port 8001 --metrics-port 8002"
    )
    deployment_args = container(manifests["Deployment"], "specdec")["args"]
    assert deployment_args[: len(cmd_args)] == cmd_args


def test_dockerignore_keeps_the_venv_out() -> None:
    ignored = {
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git", "engines", "models", "**/__pycache__", "**/*.so"} <= ignored
    copied = ("README.md", "pyproject.toml", "setup.py", "python_backend", "build_engines", "client")
    assert not ignored & set(copied)


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


@pytest.mark.parametrize(("clonable", "fetched"), [("v1.2.1", "v1.2.1"), ("release/1.2.1", "release/1.2.1")])
def test_dockerfile_fetches_the_examples_from_the_tag_or_the_release_branch(
    tmp_path: Path, clonable: str, fetched: str
) -> None:
    """When the image lacks TensorRT-LLM's examples, the Dockerfile clones them at v<version>, then at
    release/<version> (NVIDIA builds 1.2.1 from that branch; the tag is not verified). The RUN step is
    executed with a git that can clone only ``clonable``."""
    runs = [rest for word, rest in dockerfile_instructions() if word == "RUN"]
    (step,) = [rest for rest in runs if "sparse-checkout" in rest]
    (tmp_path / "opt").mkdir()
    (tmp_path / "opt" / "TENSORRT_LLM_VERSION").write_text("1.2.1\n")
    script = step.replace("/opt/specdec/TENSORRT_LLM_VERSION", str(tmp_path / "opt" / "TENSORRT_LLM_VERSION"))
    script = script.replace("/app/examples", str(tmp_path / "no-image-examples"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_git = bin_dir / "git"
    fake_git.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = clone ]; then\n'
        '  for a in "$@"; do prev_is_branch=${branch_next:-}; branch_next=; '
        '[ "$prev_is_branch" = 1 ] && ref=$a; [ "$a" = --branch ] && branch_next=1; dest=$a; done\n'
        f'  [ "$ref" = "{clonable}" ] || exit 128\n'
        '  for arch in llama qwen; do mkdir -p "$dest/examples/models/core/$arch"; '
        'touch "$dest/examples/models/core/$arch/convert_checkpoint.py"; done\n'
        "fi\n"
        "exit 0\n"
    )
    fake_git.chmod(0o755)
    examples = tmp_path / "app" / "tensorrt_llm" / "examples"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TRTLLM_EXAMPLES_DIR": str(examples),
           "TRTLLM_GIT_REF": ""}  # fmt: skip
    run = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert f"fetched TensorRT-LLM {fetched} examples" in run.stdout
    assert (examples / "models/core/qwen/convert_checkpoint.py").is_file()
    # and when neither ref exists, the build stops saying which refs it tried
    fake_git.write_text('#!/usr/bin/env bash\n[ "$1" = clone ] && exit 128\nexit 0\n')
    env["TRTLLM_EXAMPLES_DIR"] = str(tmp_path / "other")
    failed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert failed.returncode != 0 and "v1.2.1 release/1.2.1" in failed.stderr
