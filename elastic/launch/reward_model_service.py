"""`reward.kind: model`: a trained reward model served by Ray actors, scoring the policy's samples.

    client = start_rm_service(cfg.reward, name=f"rm-{run_name}")      # driver, before training
    client = connect_rm(name)                                          # any train worker
    scores = client.score([prompt_ids + completion_ids, ...])          # [n] float32

`reward.model_actors` actors each hold the model (`reward.model_path`: one of our reward-model
checkpoints, `<run>/step_N`, or a Hugging Face *ForSequenceClassification directory), on a GPU
when the cluster has one for them (`reward.model_use_gpu`), else on CPUs. A call splits its
sequences over the actors and waits for all; each actor scores in length-sorted batches of
`reward.model_batch`. The sequences are token ids in the policy's tokenizer, which must be the
reward model's (checked on the driver): a reward model trained from the same SFT policy, as
jobs/reward_model.py does, always qualifies.

How a score becomes a reward: `reward.kind` is a weighted sum of terms (elastic/reward/
verifiers.py); the `model` term's weight multiplies the score and is added by the trainer to
what the verifier pool returned for the other terms (the pool never sees a model).
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import numpy as np

ACTOR_PREFIX = "elastic-rm"


def _actor_cls():
    import ray

    @ray.remote
    class RewardModelActor:
        def __init__(self, path: str, dtype: str, batch: int) -> None:
            import torch

            from elastic.model.hf import from_pretrained

            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            name = dtype if dtype != "auto" else ("bfloat16" if self.device.type == "cuda" else "float32")
            if self.device.type == "cpu":
                torch.set_num_threads(max(1, int(os.environ.get("ELASTIC_RM_THREADS", "1"))))
            self.model = from_pretrained(path, device=self.device, dtype=getattr(torch, name)).eval()
            if not self.model.args.num_labels:
                raise ValueError(f"reward.model_path {path}: a causal LM, not a reward model (num_labels 1)")
            self.batch = batch

        def score(self, seqs: List[List[int]]) -> np.ndarray:
            from elastic.rl.reward_model import score_sequences

            return score_sequences(self.model, seqs, self.batch)

        def ping(self) -> bool:
            return True

    return RewardModelActor


class RewardModelClient:
    """Picklable: actor names only; workers resolve them on first use."""

    def __init__(self, names: Sequence[str], namespace: Optional[str] = None) -> None:
        self.names, self.namespace = list(names), namespace
        self._handles = None

    def _actors(self, timeout_s: float = 60.0):
        """The actors, looked up by name (waiting up to `timeout_s` for registration)."""
        import time

        import ray

        deadline = time.monotonic() + timeout_s
        while self._handles is None:
            try:
                self._handles = [ray.get_actor(n, namespace=self.namespace) for n in self.names]
            except ValueError:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"no reward-model actors named {self.names[0]!r}... after {timeout_s:g} s "
                                       "(the driver starts them with start_rm_service)") from None
                time.sleep(0.5)
        return self._handles

    def score(self, seqs: Sequence[Sequence[int]], timeout_s: float = 600.0) -> np.ndarray:
        """[n] float32 scores, in order. Sequences are dealt to the actors round-robin by length
        rank, so each gets a similar share of the tokens."""
        import ray

        if not seqs:
            return np.zeros(0, np.float32)
        actors = self._actors()
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        parts = [order[a::len(actors)] for a in range(len(actors))]
        refs = [h.score.remote([list(seqs[i]) for i in p]) for h, p in zip(actors, parts) if p]
        got = ray.get(refs, timeout=timeout_s)
        out = np.zeros(len(seqs), np.float32)
        for p, g in zip([p for p in parts if p], got):
            out[p] = g
        return out

    def __getstate__(self):
        return {"names": self.names, "namespace": self.namespace}

    def __setstate__(self, d):
        self.names, self.namespace, self._handles = d["names"], d["namespace"], None


def start_rm_service(section, name: str, namespace: Optional[str] = None) -> RewardModelClient:
    """Start `section.model_actors` named actors holding `section.model_path` and wait until they
    answer (a path that is not a reward model fails here, in one line)."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0) > 0
    use_gpu = section.model_use_gpu == "true" or (section.model_use_gpu == "auto" and gpus)
    opts = {"num_gpus": 1} if use_gpu else {"num_cpus": 1}
    Actor = _actor_cls()
    names = [f"{ACTOR_PREFIX}-{name}-{i}" for i in range(section.model_actors)]
    handles = [Actor.options(name=n, namespace=namespace, **opts).remote(os.path.abspath(section.model_path), "auto",
                                                                          section.model_batch) for n in names]
    try:
        ray.get([h.ping.remote() for h in handles], timeout=600)
    except ray.exceptions.RayActorError as e:
        for h in handles:
            ray.kill(h)
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise RuntimeError(f"reward.model_path {section.model_path}: the reward-model actors did not start ({msg})") from None
    client = RewardModelClient(names, namespace)
    client._handles = handles  # the driver's client holds the actors for the job's life
    return client


def stop_rm_service(client: RewardModelClient) -> None:
    import ray

    for n in client.names:
        try:
            ray.kill(ray.get_actor(n, namespace=client.namespace))
        except ValueError:
            pass
