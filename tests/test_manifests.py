"""The shipped Kubernetes manifests are valid for KubeRay and consistent with the trainer.

Fast and offline (no Ray cluster, no Kubernetes): schema validation against KubeRay's v1 CRDs
from ../shared/kuberay/crds (or $ELASTIC_SHARED_DIR/kuberay/crds) plus the checks the schema
cannot make, then cross-checks between the manifests, the job configs, the Dockerfile and the
scripts, so that a pod group, a config and an image cannot drift apart unnoticed.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Dict

import pytest
import yaml

from tests import k8s_checks as k
from elastic.config import Config, load_config

REPO = k.REPO
CLUSTER = REPO / "ray-cluster.yaml"
RAYJOBS = sorted((REPO / "jobs" / "k8s").glob("*-rayjob.yaml"))
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
TRAINER_GROUP, REWARD_GROUP = "trainer-gpu", "reward-cpu"


def _doc(path: Path) -> Dict[str, Any]:
    (d,) = k.load_docs(path)
    return d


@pytest.fixture(scope="module")
def schemas() -> Dict[str, Dict[str, Any]]:
    d = k.crd_dir()
    if d is None:
        pytest.skip("KubeRay CRDs not found: expected ../shared/kuberay/crds next to the repo "
                    "or $ELASTIC_SHARED_DIR/kuberay/crds (a plain clone has no shared/ folder)")
    return {kind: k.load_crd_schema(d / f) for kind, f in CRD_FILES.items()}


@pytest.fixture(scope="module")
def cluster() -> Dict[str, Any]:
    return _doc(CLUSTER)


def _cluster_spec(doc: Dict[str, Any]) -> Dict[str, Any]:
    return doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]


def _group(spec: Dict[str, Any], name: str) -> Dict[str, Any]:
    return dict(k.groups(spec))[name]


MANIFESTS = [CLUSTER] + RAYJOBS


def test_rayjob_manifests_are_shipped():
    assert {p.name for p in RAYJOBS} >= {"pretrain-rayjob.yaml", "grpo-rayjob.yaml"}


# ---- schema and the checks the schema cannot make ------------------------------------------

@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_validates_against_kuberay_crd(path, schemas):
    doc = _doc(path)
    assert doc["apiVersion"] == "ray.io/v1", "only the v1 API is served as storage version"
    schema = schemas[doc["kind"]]
    errors = k.schema_errors(k.apply_defaults(doc, schema), schema)
    assert not errors, f"{path.name} fails the {doc['kind']} CRD:\n" + "\n".join(errors)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_no_unknown_fields(path, schemas):
    doc = _doc(path)
    unknown = k.unknown_fields(doc, schemas[doc["kind"]])
    assert not unknown, f"{path.name}: fields the API server would silently drop: {unknown}"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_quantities_are_quoted(path, schemas):
    doc = _doc(path)
    problems = k.quantity_problems(doc, schemas[doc["kind"]])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_string_maps_and_replica_ranges(path):
    spec = _cluster_spec(_doc(path))
    assert not k.string_map_problems(spec)
    assert not k.replica_problems(spec)
    for g in spec["workerGroupSpecs"]:
        assert g["replicas"] == g["minReplicas"], f"{g['groupName']}: replicas starts at minReplicas"


def test_the_schema_checks_catch_the_known_pitfalls(schemas, cluster):
    """The extra checks are live: each README pitfall, planted in a copy, is reported."""
    schema = schemas["RayCluster"]
    bad = yaml.safe_load(yaml.safe_dump(cluster))
    g = bad["spec"]["workerGroupSpecs"][0]
    g["maxReplica"] = g.pop("maxReplicas")  # typo
    g["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = 0.5
    g["rayStartParams"] = {"num-cpus": 1}
    bad["spec"]["workerGroupSpecs"][1]["replicas"] = 9  # above maxReplicas 4
    assert any("maxReplica" in u for u in k.unknown_fields(bad, schema))
    assert any("cpu" in e for e in k.schema_errors(k.apply_defaults(bad, schema), schema))
    assert k.string_map_problems(bad["spec"])
    assert k.replica_problems(bad["spec"])
    # Without defaulting, required min/maxReplicas would be reported although the API server fills them.
    nodefault = yaml.safe_load(yaml.safe_dump(cluster))
    del nodefault["spec"]["workerGroupSpecs"][1]["minReplicas"]
    assert any("minReplicas" in e for e in k.schema_errors(nodefault, schema))
    assert not k.schema_errors(k.apply_defaults(nodefault, schema), schema)


# ---- what the issue asks of the cluster ------------------------------------------------------

def test_head_runs_no_training_and_is_not_exposed(cluster):
    head = cluster["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"
    assert not k.custom_resources(k.ray_resources(head, is_head=True))
    assert "nvidia.com/gpu" not in head["template"]["spec"]["containers"][0]["resources"].get("limits", {})


def test_token_auth_with_user_created_secret(cluster):
    auth = cluster["spec"]["authOptions"]
    assert auth["mode"] == "token" and auth["secretName"]
    (secret,) = k.load_docs(REPO / "jobs" / "k8s" / "auth-secret.example.yaml")
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == auth["secretName"]
    assert set(secret["stringData"]) == {"auth_token"}, "KubeRay reads the `auth_token` key"
    for path in RAYJOBS:
        env = _doc(path)["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["env"]
        refs = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") or e.get("value") for e in env}
        assert refs["RAY_AUTH_MODE"] == "token"
        assert refs["RAY_AUTH_TOKEN"] == {"name": auth["secretName"], "key": "auth_token"}


def test_autoscaling_suits_slow_gpu_pods(cluster):
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    opts = spec["autoscalerOptions"]
    assert opts["version"] == "v2", "per-group idleTimeoutSeconds needs autoscaler v2"
    assert opts["upscalingMode"] in ("Default", "Aggressive"), "do not rate-limit slow GPU pod requests"
    trainer = _group(spec, TRAINER_GROUP)
    assert trainer["idleTimeoutSeconds"] >= 10 * 60 > opts["idleTimeoutSeconds"]


def test_trainer_group_has_gpus_shm_and_its_resource(cluster):
    g = _group(cluster["spec"], TRAINER_GROUP)
    pod = g["template"]["spec"]
    ray = pod["containers"][0]
    assert ray["name"] == "ray-worker", "KubeRay and the autoscaler read containers[0]"
    assert k.parse_quantity(ray["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    shm = [m for m in ray["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert shm, "NCCL needs a memory-backed /dev/shm"
    vol = {v["name"]: v for v in pod["volumes"]}[shm[0]["name"]]
    assert vol["emptyDir"]["medium"] == "Memory"
    assert k.custom_resources(k.ray_resources(g)), "the trainer group advertises a custom resource"


def test_ray_container_is_first_everywhere(cluster):
    for name, g in k.groups(cluster["spec"]):
        assert g["template"]["spec"]["containers"][0]["name"] in ("ray-head", "ray-worker"), name


def test_rayjobs_clean_up_and_keep_the_driver_off_the_head(cluster):
    for path in RAYJOBS:
        spec = _doc(path)["spec"]
        assert spec["rayClusterSpec"] == cluster["spec"], f"{path.name}: rayClusterSpec drifted from ray-cluster.yaml"
        assert spec["shutdownAfterJobFinishes"] is True
        assert spec["ttlSecondsAfterFinished"] > 0
        assert spec["entrypointNumCpus"] > 0
        wanted = json.loads(spec["entrypointResources"])
        head = k.ray_resources(spec["rayClusterSpec"]["headGroupSpec"], is_head=True)
        assert head.get("CPU", 0) == 0 and not set(wanted) & set(head), "the head must not fit the driver"
        hosts = [n for n, g in k.groups(spec["rayClusterSpec"]) if n != "head"
                 and all(k.ray_resources(g).get(r, 0) >= v for r, v in wanted.items())
                 and k.ray_resources(g).get("CPU", 0) >= spec["entrypointNumCpus"]]
        assert hosts == [REWARD_GROUP], f"{path.name}: the driver should fit only the CPU group, fits {hosts}"


# ---- cross-checks with the trainer, the reward pool, the image and the scripts -------------------

def _config(name: str) -> Config:
    return load_config(str(REPO / "jobs" / "configs" / name))


def _offering(spec: Dict[str, Any], resource: str):
    return [n for n, g in k.groups(spec) if k.ray_resources(g).get(resource)]


@pytest.mark.parametrize("cfg_name", ["k8s-pretrain.yaml", "k8s-grpo.yaml"])
def test_trainer_resources_and_range_match_the_config(cluster, cfg_name):
    spec, cfg = cluster["spec"], _config(cfg_name)
    g = _group(spec, TRAINER_GROUP)
    pod = k.ray_resources(g)
    assert cfg.scaling.resources_per_worker, "train workers must request the trainer resource"
    assert cfg.scaling.use_gpu == "true", "with autoscaling the driver may start before GPU pods exist"
    for res, amount in cfg.scaling.resources_per_worker.items():
        assert _offering(spec, res) == [TRAINER_GROUP], f"{res} must be offered by the trainer group only"
        per_pod = pod[res] / amount
        assert per_pod == pod["GPU"], "workers per pod (by the custom resource) must equal GPUs per pod"
        assert pod["CPU"] >= per_pod * cfg.scaling.cpus_per_worker
        assert g["minReplicas"] * per_pod == cfg.scaling.min_workers
        assert g["maxReplicas"] * per_pod == cfg.scaling.max_workers
        # The project's default elastic range fits the group too.
        default = Config().scaling
        assert g["minReplicas"] * per_pod <= default.min_workers <= default.max_workers <= g["maxReplicas"] * per_pod


def test_reward_resource_matches_the_reward_pool(cluster):
    spec, cfg = cluster["spec"], _config("k8s-grpo.yaml")
    res = cfg.reward.actor_resource
    assert res, "reward actors must request a custom resource to land on CPU pods"
    assert _offering(spec, res) == [REWARD_GROUP]
    g = _group(spec, REWARD_GROUP)
    pod = k.ray_resources(g)
    # What each reward actor requests: 1 CPU plus RESOURCE_AMOUNT of the label resource.
    from elastic.reward.pool import RESOURCE_AMOUNT

    assert "GPU" not in pod
    actors_per_pod = min(pod["CPU"] // 1, pod[res] // RESOURCE_AMOUNT)
    assert actors_per_pod == pod["CPU"], "CPUs, not the label, should bound reward actors per pod"
    assert g["maxReplicas"] * actors_per_pod >= cfg.reward.num_actors


def test_checkpoint_storage_is_shared_by_every_pod(cluster):
    (pvc,) = k.load_docs(REPO / "jobs" / "k8s" / "checkpoints-pvc.yaml")
    assert pvc["kind"] == "PersistentVolumeClaim" and "ReadWriteMany" in pvc["spec"]["accessModes"]
    k.parse_quantity(pvc["spec"]["resources"]["requests"]["storage"])
    for cfg_name in ("k8s-pretrain.yaml", "k8s-grpo.yaml"):
        storage = _config(cfg_name).run.storage_path
        if "://" in storage:
            continue
        for name, g in k.groups(cluster["spec"]):
            pod = g["template"]["spec"]
            claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
            mounts = [m for m in pod["containers"][0]["volumeMounts"]
                      if m["name"] in claims and storage.startswith(m["mountPath"].rstrip("/") + "/")]
            assert mounts and claims[mounts[0]["name"]] == pvc["metadata"]["name"], f"{name} lacks {storage}"


def test_image_ray_version_equals_ray_version(cluster):
    version = cluster["spec"]["rayVersion"]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(rf"^ARG RAY_VERSION={re.escape(version)}$", dockerfile, re.M), "Dockerfile RAY_VERSION"
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}-", dockerfile, re.M)
    assert '"ray[default,train,data]==${RAY_VERSION}"' in dockerfile, "pip must keep the image's Ray"
    images = [c["image"] for _, g in k.groups(cluster["spec"]) for c in g["template"]["spec"]["containers"]]
    for path in RAYJOBS:
        doc = _doc(path)
        assert doc["spec"]["rayClusterSpec"]["rayVersion"] == version
        images += [c["image"] for c in doc["spec"]["submitterPodTemplate"]["spec"]["containers"]]
    for image in images:
        tag = image.rsplit(":", 1)[1]
        assert tag.startswith((f"ray{version}-", f"{version}-")), f"{image} is not built for Ray {version}"


def test_entrypoints_share_the_pretrain_interface():
    """python <image dir>/jobs/<entry>.py --config <image dir>/jobs/configs/<cfg>.yaml."""
    for path in RAYJOBS:
        argv = shlex.split(_doc(path)["spec"]["entrypoint"])
        assert argv[0] == "python" and argv[2] == "--config", argv
        m = re.fullmatch(r"/home/ray/elastic/(jobs/\w+\.py)", argv[1])
        c = re.fullmatch(r"/home/ray/elastic/(jobs/configs/[\w-]+\.yaml)", argv[3])
        assert m and c, argv
        load_config(str(REPO / c.group(1)))  # the config exists and is valid today
        assert (REPO / m.group(1)).is_file(), f"{m.group(1)} does not exist"
        assert len(argv) == 4 or all(a == "--set" or "=" in a for a in argv[4:])


def test_scripts_use_the_manifest_names(cluster):
    local = (REPO / "scripts" / "local_cluster.sh").read_text()
    spec = cluster["spec"]
    trainer_res = set(k.custom_resources(k.ray_resources(_group(spec, TRAINER_GROUP))))
    reward_res = set(k.custom_resources(k.ray_resources(_group(spec, REWARD_GROUP))))
    assert trainer_res == {re.search(r"^TRAINER_RESOURCE=(\w+)$", local, re.M).group(1)}
    assert reward_res == {re.search(rf"^{v}=(\w+)$", local, re.M).group(1) for v in ("REWARD_RESOURCE", "DRIVER_RESOURCE")}
    scale = (REPO / "scripts" / "scale_trainers.sh").read_text()
    assert re.search(rf"group={TRAINER_GROUP}\b", scale) and re.search(rf"cluster={cluster['metadata']['name']}\b", scale)


def test_autoscaler_sees_the_resources_we_compute(cluster):
    """Ray's own KubeRay autoscaler parser agrees with ray_resources() on every group."""
    mod = pytest.importorskip("ray.autoscaler._private.kuberay.autoscaling_config")
    cr = yaml.safe_load(yaml.safe_dump(cluster))
    cr["metadata"]["namespace"] = "default"
    types = mod._derive_autoscaling_config_from_ray_cr(cr)["available_node_types"]
    for name, g in k.groups(cluster["spec"]):
        theirs = {r: float(v) for r, v in types["headgroup" if name == "head" else name]["resources"].items() if r != "memory" and v}
        assert theirs == k.ray_resources(g, is_head=name == "head"), name
