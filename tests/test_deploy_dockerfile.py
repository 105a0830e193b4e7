"""deploy/Dockerfile, checked offline (no image is built): the base image and the install, the command
the Deployment runs, what .dockerignore keeps out, and where the examples are fetched from.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_manifests import (
    BASE_IMAGE,
    DEPLOY,
    DOCKERFILE,
    ROOT,
    Manifests,
    container,
    dockerfile_instructions,
)


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
