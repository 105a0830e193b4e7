"""deploy/k8s, checked offline: no cluster is contacted. Every manifest is validated against the
Kubernetes OpenAPI schemas bundled in kubernetes-validate, in strict mode (unknown fields fail), for
Kubernetes 1.32 and 1.37; then the settings specdec depends on are asserted (GPU request, probes,
/dev/shm, labels shared by Deployment/Service/PDB, the HPA's metric, the YAML in the ConfigMap
through our own config loader). Each check is also run on a deliberately broken copy, to show that
it fails there.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_manifests import (
    CHECKS,
    K8S,
    KUBERNETES_VERSIONS,
    MANIFEST_FILES,
    Manifests,
    container,
    load_manifests,
    pod_spec,
)
from trispec.errors import ConfigError


@pytest.mark.parametrize("name", CHECKS)
def test_manifest_settings(manifests: Manifests, name: str) -> None:
    CHECKS[name](manifests)


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
