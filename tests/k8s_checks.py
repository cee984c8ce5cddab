"""Offline checks of Kubernetes manifests against KubeRay's CRDs (helpers for test_manifests.py).

Plain JSON-schema validation of a CRD's ``openAPIV3Schema`` misses what the API server and
the operator would do or reject, so this module adds what the shared CRD README lists:
API-server defaulting before validation, unknown fields (which the API server drops
silently), quantities that must be strings, string-only maps, and replica ranges.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import yaml

REPO = Path(__file__).resolve().parents[1]

# ObjectMeta is not described by the CRD schema (it is `type: object`); these are the fields
# a manifest may reasonably set.
OBJECT_META_FIELDS = {"name", "namespace", "labels", "annotations", "generateName"}


def crd_dir() -> Optional[Path]:
    """`$ELASTIC_SHARED_DIR/kuberay/crds`, else `<repo>/../shared/kuberay/crds`; None if absent."""
    candidates = []
    if os.environ.get("ELASTIC_SHARED_DIR"):
        candidates.append(Path(os.environ["ELASTIC_SHARED_DIR"]) / "kuberay" / "crds")
    candidates.append(REPO.parent / "shared" / "kuberay" / "crds")
    for c in candidates:
        if (c / "ray.io_rayclusters.yaml").is_file() and (c / "ray.io_rayjobs.yaml").is_file():
            return c
    return None


def load_crd_schema(path: Path, version: str = "v1") -> Dict[str, Any]:
    """The `openAPIV3Schema` of one served version of a CRD file."""
    # The libyaml loader parses the 2 MB CRDs in ~1 s instead of ~20 s.
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(f"{path.name}: no version {version}")


def load_docs(path: Path) -> List[Dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def apply_defaults(obj: Any, schema: Dict[str, Any]) -> Any:
    """Fill `default`s the way the API server does: only inside objects that are present."""
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
        for key, val in obj.items():
            if key in props:
                apply_defaults(val, props[key])
            elif isinstance(schema.get("additionalProperties"), dict):
                apply_defaults(val, schema["additionalProperties"])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            apply_defaults(item, schema["items"])
    return obj


def schema_errors(obj: Dict[str, Any], schema: Dict[str, Any]) -> List[str]:
    """jsonschema errors (OpenAPI v3 is close enough to draft 7 for these CRDs), as `path: msg`."""
    import jsonschema

    validator = jsonschema.Draft7Validator(schema)
    out = []
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        out.append(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}")
    return out


def unknown_fields(obj: Any, schema: Dict[str, Any], path: str = "") -> List[str]:
    """Paths of keys the schema does not declare (the API server would prune them silently)."""
    out: List[str] = []
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return out
    if isinstance(obj, dict):
        props = schema.get("properties")
        addl = schema.get("additionalProperties")
        if path.endswith("/metadata") and props is None:
            out += [f"{path}/{k}" for k in obj if k not in OBJECT_META_FIELDS]
            return out
        for key, val in obj.items():
            if props is not None and key in props:
                out += unknown_fields(val, props[key], f"{path}/{key}")
            elif isinstance(addl, dict):
                out += unknown_fields(val, addl, f"{path}/{key}")
            elif props is not None and not addl:
                out.append(f"{path}/{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def _is_quantity(schema: Dict[str, Any]) -> bool:
    return bool(schema.get("x-kubernetes-int-or-string")) and "pattern" in schema


def quantity_problems(obj: Any, schema: Dict[str, Any], path: str = "") -> List[str]:
    """Quantities that are not quoted strings matching the Kubernetes quantity pattern.

    The CRD accepts integers too, but YAML turns `1e3`, `0.5` or `1_000` into numbers the API
    server rejects or misreads, so this project writes every quantity as a string.
    """
    out: List[str] = []
    if _is_quantity(schema):
        if not isinstance(obj, str):
            out.append(f"{path}: quantity {obj!r} must be a quoted string")
        elif not re.fullmatch(schema["pattern"], obj):
            out.append(f"{path}: {obj!r} is not a Kubernetes quantity")
        return out
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        addl = schema.get("additionalProperties")
        for key, val in obj.items():
            sub = props.get(key, addl if isinstance(addl, dict) else None)
            if sub is not None:
                out += quantity_problems(val, sub, f"{path}/{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += quantity_problems(item, schema["items"], f"{path}[{i}]")
    return out


def groups(cluster_spec: Dict[str, Any]) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(name, group spec) for the head ("head") and every worker group."""
    yield "head", cluster_spec["headGroupSpec"]
    for g in cluster_spec.get("workerGroupSpecs", []):
        yield g["groupName"], g


def string_map_problems(cluster_spec: Dict[str, Any]) -> List[str]:
    """Non-string values in rayStartParams / resources / labels maps (the CRD wants strings)."""
    out = []
    for name, g in groups(cluster_spec):
        for field in ("rayStartParams", "resources", "labels"):
            for k, v in (g.get(field) or {}).items():
                if not isinstance(v, str):
                    out.append(f"{name}.{field}.{k}: {v!r} must be a string")
    return out


def replica_problems(cluster_spec: Dict[str, Any]) -> List[str]:
    """The operator-side rule min <= replicas <= max that the schema cannot express."""
    out = []
    for g in cluster_spec.get("workerGroupSpecs", []):
        mn, mx, rep = g.get("minReplicas", 0), g.get("maxReplicas", 2**31 - 1), g.get("replicas", 0)
        if not (0 <= mn <= rep <= mx):
            out.append(f"{g['groupName']}: need 0 <= minReplicas ({mn}) <= replicas ({rep}) <= maxReplicas ({mx})")
    return out


_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def parse_quantity(q: Any) -> float:
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(q))
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"cannot parse quantity {q!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def ray_resources(group: Dict[str, Any], is_head: bool = False) -> Dict[str, float]:
    """Ray logical resources one pod of a group offers, as KubeRay passes them to `ray start`.

    Precedence as in KubeRay / the Ray autoscaler: the group's `resources` map, then
    rayStartParams (num-cpus, num-gpus, resources JSON), then the Ray container's limits.
    """
    params = group.get("rayStartParams") or {}
    limits = group["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
    res: Dict[str, float] = {}
    if "num-cpus" in params:
        res["CPU"] = float(params["num-cpus"])
    elif "cpu" in limits:
        res["CPU"] = float(int(-(-parse_quantity(limits["cpu"]) // 1)))
    if "num-gpus" in params:
        res["GPU"] = float(params["num-gpus"])
    elif "nvidia.com/gpu" in limits:
        res["GPU"] = parse_quantity(limits["nvidia.com/gpu"])
    if "resources" in params:
        raw = params["resources"].strip().strip("'\"").replace('\\"', '"')
        res.update({k: float(v) for k, v in json.loads(raw).items()})
    for k, v in (group.get("resources") or {}).items():
        res[k] = parse_quantity(v) if k not in ("CPU", "GPU") else float(v)
    return {k: v for k, v in res.items() if v}


def custom_resources(res: Dict[str, float]) -> Dict[str, float]:
    """The custom part of a resource dict (what placement by resource name relies on)."""
    return {k: v for k, v in res.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")}
