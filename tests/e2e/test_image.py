"""The container image's entry point and the Kubernetes manifest (offline). The image itself is built and run in
CI by .ci/image (buildah); these tests need neither a container engine nor a cluster."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from helpers import REPO

ENTRYPOINT = REPO / "deploy" / "docker" / "entrypoint.sh"
MANIFEST = REPO / "deploy" / "kubernetes" / "train.yaml"
K8S_VERSION = "1.30"  # schemas bundled with kubernetes-validate: no network


def stub_bin(tmp_path):
    """``python`` and ``torchrun`` stubs that print what they were run with (and $HOME)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "torchrun"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $* HOME=$HOME"\n')
        (bin_dir / name).chmod(0o755)
    return bin_dir


def entry(tmp_path, *args, volumes, uid=None, home=None):
    env = {
        "PATH": f"{stub_bin(tmp_path)}{os.pathsep}/usr/bin:/bin",
        "PROJECT_VOLUMES": " ".join(map(str, volumes)),
        "HOME": str(home or tmp_path),
    }
    script = ENTRYPOINT
    if uid is not None and os.geteuid() == 0:
        script = tmp_path / "entrypoint.sh"  # readable by that uid wherever the checkout lies
        shutil.copy(ENTRYPOINT, script)
        script.chmod(0o755)
    cmd = ["sh", str(script), *args]
    if uid is not None and os.geteuid() == 0:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_entrypoint_runs_fit_by_default_a_named_command_or_anything_else(tmp_path):
    data, logs = tmp_path / "data", tmp_path / "logs"
    data.mkdir()
    logs.mkdir()
    cases = {
        ("--config", "configs/cifar10.yaml"): "python -m project.fit --config configs/cifar10.yaml",
        ("evaluate", "logs/x/version_0"): "python -m project.evaluate logs/x/version_0",
        ("predict", "run", "img.png"): "python -m project.predict run img.png",
        ("torchrun", "--nnodes=2", "-m", "project.fit"): "torchrun --nnodes=2 -m project.fit",
        (): "python -m project.fit",
    }
    for args, want in cases.items():
        proc = entry(tmp_path, *args, volumes=[data, logs])
        assert proc.returncode == 0 and proc.stdout.startswith(want + " HOME="), (args, proc.stdout, proc.stderr)


@pytest.fixture
def open_tmp():
    """A temporary folder other users can reach (pytest's tmp_path lies under a folder only its owner can)."""
    path = Path(tempfile.mkdtemp())
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def other_users_folder(open_tmp):
    """A folder uid 1000 cannot write: root's when we are root (the test then runs the entry point as uid 1000),
    else a read-only one of our own."""
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("setpriv (util-linux) is needed to drop root")
    folder = open_tmp / "logs"
    folder.mkdir(mode=0o755)
    if os.geteuid() != 0:
        folder.chmod(0o555)
    yield folder
    folder.chmod(0o755)


def test_entrypoint_refuses_an_unwritable_volume_with_one_line_and_the_fix(open_tmp, other_users_folder):
    tmp_path = open_tmp
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    uid = 1000 if os.geteuid() == 0 else os.geteuid()
    proc = entry(tmp_path, "--config", "configs/mnist.yaml", volumes=[data, other_users_folder], uid=uid)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout  # nothing was started
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {other_users_folder} (a volume) is not writable by uid {uid}"), line
    assert f"belongs to uid {other_users_folder.stat().st_uid}" in line
    assert '--user "$(id -u):$(id -g)"' in line and f"chown {uid}:" in line and "fsGroup" in line


def test_entrypoint_gives_another_user_a_writable_home(open_tmp):
    """``docker run --user 1234:1234``: uid 1234 has no home in the image; caches go to a temporary one."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run as another uid")
    tmp_path = open_tmp
    volume = tmp_path / "logs"
    volume.mkdir()
    volume.chmod(0o777)
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    proc = entry(tmp_path, "fit", volumes=[volume], uid=1234, home=home)
    assert proc.returncode == 0, proc.stderr
    got_home = proc.stdout.split("HOME=")[1].strip()
    assert got_home != str(home) and os.stat(got_home).st_uid == 1234


def manifest() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def test_kubernetes_manifest_is_valid_and_consistent():
    """Every resource validates strictly (no unknown field) against Kubernetes' own schema; the Job, the headless
    Service and torchrun agree on the node count, the rendezvous address and the GPUs per node; the training
    arguments parse."""
    docs = {d["kind"]: d for d in manifest()}
    for doc in docs.values():
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    job, service = docs["Job"], docs["Service"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    opts = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
    assert args[0] == "torchrun" and "command" not in container  # the image's entry point stays in front
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert int(opts["--nnodes"]) == int(opts["--trainer.num_nodes"]) == spec["completions"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert int(opts["--nproc_per_node"]) == int(opts["--trainer.devices"]) == gpus
    assert opts["--node_rank"] == "$(NODE_RANK)"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env["NODE_RANK"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["PROJECT_JOB_ID"] == "metadata.labels['controller-uid']"
    assert service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert opts["--master_addr"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["fsGroup"] == 1000
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    claim = docs["PersistentVolumeClaim"]
    shared = {
        v["name"]
        for v in pod["volumes"]
        if v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]
    }
    assert {mounts["/app/logs"]["name"], mounts["/app/data"]["name"]} <= shared
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    fit_args = args[args.index("project.fit") + 1 :]
    proc = subprocess.run(
        [sys.executable, "-m", "project.fit", *fit_args, "--print_config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed["trainer"]["num_nodes"] == spec["completions"] and printed["trainer"]["strategy"] == "ddp"


def test_kubernetes_validation_catches_a_misspelt_field():
    """The validation above is not vacuous: a misspelt Job field fails it."""
    job = copy.deepcopy(next(d for d in manifest() if d["kind"] == "Job"))
    job["spec"]["completion"] = job["spec"].pop("completions")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)
