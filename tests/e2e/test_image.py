"""The container image's entry point (offline). The image itself is built and run in CI by .ci/image (buildah);
these tests need no container engine. The Kubernetes manifests: tests/cluster/test_manifests.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import REPO

ENTRYPOINT = REPO / "deploy" / "docker" / "entrypoint.sh"


def stub_bin(tmp_path):
    """``python`` and ``torchrun`` stubs that print what they were run with (and $HOME)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "torchrun"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $* HOME=$HOME"\n')
        (bin_dir / name).chmod(0o755)
    return bin_dir


def entry(tmp_path, *args, volumes, uid=None, home=None, **env_vars):
    env = {
        "PATH": f"{stub_bin(tmp_path)}{os.pathsep}/usr/bin:/bin",
        "PROJECT_VOLUMES": " ".join(map(str, volumes)),
        "HOME": str(home or tmp_path),
        **env_vars,
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
        ("torchrun", "--nnodes=2", "-m", "project.fit"): "python -m project.cli.torchrun --nnodes=2 -m project.fit",
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
    """Under Docker/podman: run as the folder's owner, or chown it on the host."""
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
    assert '--user "$(id -u):$(id -g)"' in line and f"chown {uid}:" in line and "keep-id" in line
    assert "fsGroup" not in line and "runAsUser" not in line


def test_entrypoint_names_the_kubernetes_fix_for_the_volumes_owner(open_tmp, other_users_folder):
    """In a pod (KUBERNETES_SERVICE_HOST set) on a volume whose owner is not the pod's user, as on NFS-like volumes
    that ignore fsGroup: the fix is the pod's runAsUser/runAsGroup set to that owner (the overlays' patch), or,
    for a root-owned volume, giving it to the pod's user on the file server. A missing folder below an unwritable
    one names the same fix, with the owner of the folder in the way."""
    uid = 1000 if os.geteuid() == 0 else os.geteuid()
    folders = [other_users_folder]  # root's (as root) or a read-only one of ours
    if os.geteuid() == 0:  # also an NFS export's usual case: owned by another non-root user
        folders.append(open_tmp / "export")
        folders[-1].mkdir(mode=0o755)
        os.chown(folders[-1], 2000, 2000)
    for folder in folders:
        owner = folder.stat()
        for volume, why in ((folder, "is not writable"), (folder / "logs", "does not exist")):
            proc = entry(open_tmp, "fit", volumes=[volume], uid=uid, KUBERNETES_SERVICE_HOST="10.0.0.1")
            assert proc.returncode == 1 and proc.stdout == "", proc.stdout
            (line,) = proc.stderr.splitlines()
            assert line.startswith(f"error: {volume} (a volume) {why}") and f"uid {uid}" in line, line
            assert f"{folder} belongs to uid {owner.st_uid}, gid {owner.st_gid}" in line
            assert "docker" not in line and "NFS-like volumes ignore fsGroup" in line
            if owner.st_uid == 0:
                assert f"chown {uid}:" in line and "supplementalGroups" in line, line
            else:
                assert f"runAsUser: {owner.st_uid}, runAsGroup: {owner.st_gid}" in line, line
                assert "volume-owner.yaml" in line
    assert (REPO / "deploy/kubernetes/overlays/nfs-2x4/volume-owner.yaml").is_file()  # the patch it names


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
