"""What the deploy/ tests (``test_deploy_*.py``) share: where the files are, the Kubernetes manifests
loaded by kind, helpers that read a container's flags, ports, mounts and probes, and the checks of
the settings specdec depends on (each test file runs them on the real files and on broken copies).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from trispec.config import SpecDecConfig, parse_config

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
