"""Ray Train's controller starts without torch (elastic/launch/runtime/process_group.py).

The controller is a fresh process at every job start and imports whatever it unpickles: the
backend config, the scaling and failure policies, the run context and the callbacks. With Ray's
TorchConfig that brought torch in (2.3 s of its ~4 s start on 2 cores) though the controller
never runs a torch op. These tests take exactly what a job's trainer hands its controller and
unpickle it in a fresh interpreter, and check that ProcessGroupConfig is Ray's TorchConfig in
everything Ray Train reads of it. Every multi-worker job in the suite sets its process group up
through it (gloo); tests/test_fit_gpus.py runs its GPU-shaped branch (CUDA_VISIBLE_DEVICES
shared, the backend named by ELASTIC_TORCH_BACKEND).
"""

import dataclasses
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

UNPICKLE = """
import json, pickle, sys
sys.path.insert(0, %r)
payload = pickle.loads(open(sys.argv[1], "rb").read())
print(json.dumps({"names": sorted(payload), "torch": "torch" in sys.modules,
                  "lean_train": "elastic.launch.runtime.lean_train" in sys.modules}))
"""


def test_what_a_job_hands_its_controller_unpickles_without_torch(ray_local, tmp_path, monkeypatch):
    """The controller's arguments of a real job's trainer (elastic/launch/driver.py
    build_torch_trainer, fixed-size and elastic), captured where lean_train starts the
    controller, then loaded in a fresh interpreter: no torch, and not lean_train (whose
    TorchTrainer import is torch)."""
    import ray.cloudpickle as cloudpickle

    from elastic.config import load_config
    from elastic.launch.driver import build_torch_trainer, run_paths
    from elastic.launch.runtime import lean_train
    from elastic.train.entry import train_loop_per_worker
    from tests.helpers import small_run_overrides

    class Captured(Exception):
        pass

    seen = []

    def capture(**kwargs):
        seen.append(kwargs)
        raise Captured

    monkeypatch.setattr(lean_train, "_run_controller", capture)
    for name, extra in (("fixed", {}), ("elastic", {"scaling.min_workers": 1})):
        cfg = load_config(None, small_run_overrides(tmp_path / "runs", name, tmp_path / "corpus", 2, **extra))
        trainer = build_torch_trainer(cfg, run_paths(cfg), False, train_loop_per_worker, {})
        with pytest.raises(Captured):
            trainer.fit()
    assert len(seen) == 2
    policies = [type(k["scaling_policy"]).__name__ for k in seen]
    assert policies == ["LocalFixedScalingPolicy", "UnitElasticScalingPolicy"], policies  # ours, not Ray's
    for i, kwargs in enumerate(seen):
        assert type(kwargs["train_run_context"].backend_config).__name__ == "ProcessGroupConfig"
        payload = {k: v for k, v in kwargs.items() if k != "train_fn_ref"}  # the function runs on the workers
        path = tmp_path / f"controller-{i}.pkl"
        path.write_bytes(cloudpickle.dumps(payload))
        r = subprocess.run([sys.executable, "-c", UNPICKLE % str(REPO), str(path)], capture_output=True, text=True,
                           timeout=120, cwd=REPO)
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert {"scaling_policy", "train_run_context", "callbacks"} <= set(got["names"]), r.stdout
        assert (got["torch"], got["lean_train"]) == (False, False), r.stdout


def test_process_group_config_is_ray_torch_config_in_what_ray_train_reads():
    """The same fields and defaults, the same dict for Ray Train's run state, the same framework,
    and a backend that shares CUDA devices among a node's workers as Ray's does."""
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _TorchBackend

    from elastic.launch.runtime.process_group import ProcessGroupBackend, ProcessGroupConfig

    ours, ray_s = dataclasses.fields(ProcessGroupConfig), dataclasses.fields(TorchConfig)
    assert [(f.name, f.default) for f in ours] == [(f.name, f.default) for f in ray_s]
    for kw in ({}, {"backend": "gloo", "timeout_s": 60}, {"backend": "nccl", "init_method": "tcp"}):
        assert ProcessGroupConfig(**kw).to_dict() == TorchConfig(**kw).to_dict()
    assert ProcessGroupConfig().framework == TorchConfig().framework
    assert ProcessGroupConfig().backend_cls is ProcessGroupBackend
    for attr in ("share_cuda_visible_devices", "has_replica_groups"):
        assert getattr(ProcessGroupBackend, attr) == getattr(_TorchBackend, attr), attr
