"""docs/cluster.md matches the files and the product: the Docker and podman commands, the GPUs of the locked torch
build, the GPU error, the paths and the daemonless .sif route it names."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import REPO

DOC = REPO / "docs" / "cluster.md"


def blocks(text: str) -> list[list[str]]:
    """The fenced code blocks' commands, one per logical line (``\\`` continuations joined, comments dropped)."""
    out = []
    for block in re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        out.append([line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()])
    return out


def container_runs() -> list[tuple[str, list[str], list[str]]]:
    """(engine, options, arguments after the image) of every ``docker run`` / ``podman run`` in the doc, checking
    that each host folder it mounts was created by a ``mkdir -p`` earlier in the same block."""
    runs = []
    for block in blocks(DOC.read_text()):
        made: set[str] = set()
        for line in block:
            words = shlex.split(line)
            if words[:2] == ["mkdir", "-p"]:
                made.update(words[2:])
            if len(words) > 1 and words[0] in ("docker", "podman") and words[1] == "run":
                image = words.index("project")
                options = words[2:image]
                for i, word in enumerate(options):
                    if word == "-v":
                        host = options[i + 1].split(":")[0].removeprefix("$PWD/")
                        assert host in made, (line, host)
                runs.append((words[0], options, words[image + 1 :]))
    return runs


@pytest.mark.slow
def test_docker_and_podman_commands_use_each_engines_flags_and_parse():
    """Both engines' commands are given; GPUs are ``--gpus all`` under Docker and the CDI device under podman
    (which ignores ``--gpus``); podman keeps the user's uid (``--userns keep-id``); every mounted host folder is made
    first (podman refuses a missing one); the training arguments parse through the CLI."""
    runs = container_runs()
    assert {engine for engine, _, _ in runs} == {"docker", "podman"}
    fit_args = set()
    for engine, options, args in runs:
        gpu = "configs/trainer/gpu.yaml" in args
        if engine == "docker":
            assert ("--gpus" in options) == gpu and "--device" not in options
        else:
            assert "--gpus" not in options and ("nvidia.com/gpu=all" in options) == gpu
            assert options[options.index("--userns") + 1] == "keep-id"
        assert options[options.index("--user") + 1] == "$(id -u):$(id -g)"
        if args[0].startswith("--"):
            fit_args.add(tuple(args))
    assert len(fit_args) == 1  # the same training under both engines
    proc = subprocess.run(
        [sys.executable, "-m", "project.fit", *next(iter(fit_args)), "--print_config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert yaml.safe_load(proc.stdout)["trainer"]["accelerator"] == "gpu"


def test_supported_gpus_are_the_locked_builds():
    """The compute capabilities the doc states are the ones the installed (locked) torch has kernels for."""
    stated = re.search(r"compute capabilities \*\*(.*?)\*\*", " ".join(DOC.read_text().split())).group(1)
    assert stated.split() == torch.cuda.get_arch_list()
    assert f"torch {torch.__version__}" in DOC.read_text() and torch.version.cuda.startswith("13.")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch finds no GPU")
def test_the_gpu_error_quoted_is_the_products(tmp_path):
    quoted = next(line for block in blocks(DOC.read_text()) for line in block if line.startswith("error:"))
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "project.fit", "--config", str(REPO / "configs/cifar10.yaml")),
            *("--config", str(REPO / "configs/trainer/gpu.yaml")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == quoted, proc.stderr


def test_named_files_and_the_daemonless_route_exist():
    """Every repository path the doc names exists; the OCI-archive route is the same in the doc and in the sbatch
    script's header."""
    text = DOC.read_text()
    for path in set(re.findall(r"`((?:deploy|scripts|configs|project|tests|docs)/[\w./-]*[\w/])", text)):
        if "<" not in path:
            assert (REPO / path).exists() or (REPO / "deploy/kubernetes" / path).exists(), path
    for folder in re.findall(r"`(overlays/[\w-]+/|volume/|train/|sweep/)`", text):
        assert (REPO / "deploy/kubernetes" / folder / "kustomization.yaml").is_file(), folder
    sbatch = (REPO / "scripts/slurm.sbatch").read_text()
    for step in ("buildah push IMAGE oci-archive:project.tar", "apptainer build project.sif oci-archive://project.tar"):
        assert step in sbatch
    assert "apptainer build project.sif oci-archive://project.tar" in text and "enroot import" in text
    assert "--cleanenv" in sbatch and "--cleanenv" in text
