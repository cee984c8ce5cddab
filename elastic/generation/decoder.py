"""The model side of the generation engine: prefill prompts into cache slots, then decode one
token per slot per step with fixed shapes.

`CachedDecoder` owns a static KV cache of `slots` sequences and five [slots] state tensors on
the device: each slot's input token, its position (where the next key/value is written), its
seed, the index of the token it samples next, and whether it is live. A decode step
(`decode_step`, step.py) reads them, runs the model on [b, 1] tokens for slots [0, b), samples on the
device and advances the state in place, then returns one [2, b] tensor (tokens and
log-probabilities) that the host reads with a single `.tolist()`. Everything inside the step
has shapes fixed by (b, kv_len), touches no host value and allocates no tensor that outlives
it, which is what lets CUDA capture it as a graph (elastic/generation/cuda_graphs.py) and what the
CPU tests check (tests/test_generate_engine.py compiles it with `fullgraph=True`). The state
tensors, the shape buckets and starting a slot from its prompt's logits are `SlotDecoder`'s,
shared with the paged cache's decoder (paged_cache.PagedDecoder); the prefill forwards are
prefill.py's, the step after its attention step.py's `decode_rows`, so the two caches differ in
their attention and block bookkeeping only.

Modes:
* `eager`: CPU default. b is the number of live rows (finished rows are compacted away), and the
  step reads the cache only up to the longest live row (kv_len): the cheapest on a CPU.
* `fixed`: the shapes a captured graph needs, run eagerly: b from the power-of-two buckets,
  kv_len the longest live row rounded up to a multiple of KV_BUCKET (capped at the capacity),
  so the step reads about the filled part of the cache with few distinct shapes. A CPU can run
  it; tests use it to check what CUDA would capture.
* `graphs`: `fixed`, each (b, kv_len) captured as a CUDA graph on first use (CUDA only). Within
  one call b only shrinks and kv_len only grows, so a call captures about
  (buckets + key buckets) graphs, each once.
* `compile`: CUDA default. `graphs` around an inductor-compiled step (fused kernels; the CUDA
  graph is ours, not torch.compile's, so its lifetime and static inputs are explicit).

The model is driven block by block (`forward_hidden`), each block through its own `forward`
and not its `__call__`: on an FSDP2 model FSDP's pre/post-forward hooks would otherwise run
(and break a compiled graph at every block; dynamo skips FSDP hooks). So the parameters must
already be unsharded: elastic/train/fsdp_generate.gathered_parameters; `check_unsharded`
refuses a sharded model. A checkpoint-wrapped block is unwrapped the same way.

`RecomputeDecoder` has the same interface and recomputes every live sequence in full each
step (no cache): the exactness reference and the benchmark baseline.
"""

from __future__ import annotations

import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from elastic.generation.prefill import last_logits, prefill_slots
from elastic.generation.sampling import SamplingParams, sample
from elastic.generation.static_cache import PrefillAttention, StaticKVCache
from elastic.generation.step import decode_step

MODES = ("eager", "fixed", "graphs", "compile")
# Key-length granularity of the fixed-shape step: it reads at most this many unfilled entries.
KV_BUCKET = 256
Result = Tuple[List[int], List[float]]


def resolve_mode(mode: str, device: torch.device) -> str:
    if mode == "auto":
        return "compile" if device.type == "cuda" else "eager"
    if mode not in MODES:
        raise ValueError(f"generate: mode must be auto or one of {', '.join(MODES)}, got {mode!r}")
    if mode in ("graphs", "compile") and device.type != "cuda":
        raise ValueError(f"generate: mode {mode!r} captures CUDA graphs; the model is on {device.type}")
    return mode


def model_device(model: nn.Module) -> torch.device:
    return model.tok_embeddings.weight.device


def check_unsharded(model: nn.Module) -> None:
    """The engine calls the blocks' `forward` directly (no FSDP hooks), so FSDP parameters must be
    gathered first. DTensor is recognised by name: the model package imports no distributed code."""
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        raise ValueError("generate: the model's parameters are sharded (FSDP); generate inside "
                         "elastic.train.fsdp_generate.gathered_parameters(model), or call fsdp_generate")


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): the batch buckets of the fixed-shape step."""
    return 1 << max(0, n - 1).bit_length()


class SlotDecoder:
    """What CachedDecoder and paged_cache.PagedDecoder share: the five [slots] state tensors on
    the device (input token, position, seed, index of the next sampled token, live), the RoPE
    table, the shape buckets of the fixed-shape modes, and starting slots from their prompts'
    logits. A subclass adds its cache, prefill, step, release and move."""

    def __init__(self, model: nn.Module, slots: int, capacity: int, params: SamplingParams, mode: str,
                 kv_bucket: int = KV_BUCKET):
        self.model, self.params, self.mode, self.kv_step = model, params, mode, kv_bucket
        self.fixed = mode != "eager"
        self.slots = pow2_at_least(slots) if self.fixed else slots
        self.capacity = capacity
        dev = model_device(model)
        self.rope = model.rope_table(dev, capacity)
        self.rope_real = torch.view_as_real(self.rope).clone()  # real storage: no complex graph input
        z = lambda: torch.zeros(self.slots, dtype=torch.long, device=dev)  # noqa: E731
        self.tok, self.pos, self.seed, self.gen, self.live = z(), z(), z(), z(), z()

    def bucket(self, live: int) -> int:
        """Rows a step computes when `live` slots (packed at the front) are live."""
        return min(self.slots, pow2_at_least(live)) if self.fixed else live

    @property
    def admit_min(self) -> int:
        """Free slots worth a prefill while prompts wait: any on the eager path; with fixed shapes
        (graphs) a prefill is an uncaptured forward, so wait for an eighth of the slots."""
        return max(1, self.slots // 8) if self.fixed else 1

    def kv_bucket(self, kv_len: int) -> int:
        """Cache entries a step reads when the longest live sequence (input token included) is
        `kv_len`: exactly that on the eager path, a multiple of KV_BUCKET with fixed shapes."""
        return min(self.capacity, -(-kv_len // self.kv_step) * self.kv_step) if self.fixed else kv_len

    def start(self, slots: List[int], prompts: List[List[int]], seeds: List[int], logits: torch.Tensor) -> Result:
        """After a prefill: sample each slot's first token from logits [n, V] (row j: after prompt
        j) with its seed, and make the slot live at position len(prompt) with that token as input."""
        dev = self.tok.device
        slots_t = torch.tensor(slots, device=dev)
        seed_t = torch.tensor(seeds, dtype=torch.long, device=dev)
        zero = torch.zeros(len(slots), dtype=torch.long, device=dev)
        nxt, logp = sample(logits, self.params, seed_t, zero)
        self.tok[slots_t] = nxt
        self.pos[slots_t] = torch.tensor([len(p) for p in prompts], device=dev)
        self.seed[slots_t] = seed_t
        self.gen[slots_t] = 1
        self.live[slots_t] = 1
        out = torch.stack((nxt.double(), logp.double())).tolist()
        return [int(t) for t in out[0]], out[1]


class CachedDecoder(SlotDecoder):
    """Static KV cache + fixed-shape decode steps (see the module docstring)."""

    def __init__(self, model: nn.Module, slots: int, capacity: int, params: SamplingParams, mode: str,
                 step_fn: Optional[Callable] = None, kv_bucket: int = KV_BUCKET):
        """`step_fn` replaces `decode_step` (same signature), e.g. a torch.compile'd one."""
        super().__init__(model, slots, capacity, params, mode, kv_bucket)
        a = model.args
        dtype = model.tok_embeddings.weight.dtype  # the compute dtype (FSDP: param_dtype once gathered)
        self.cache = StaticKVCache(a.n_layers, self.slots, a.n_kv_heads, capacity, a.head_dim, dtype,
                                   model_device(model))
        self._graphs: Dict[Tuple[int, int], Callable[[], torch.Tensor]] = {}
        self._pool = None
        if step_fn is None and mode == "compile":
            from elastic.generation.step import compiled_decode_step

            step_fn = compiled_decode_step()
        self.step_fn = step_fn or decode_step

    def _args(self, b: int, kv_len: int) -> tuple:
        p = self.params
        return (self.model, self.tok, self.pos, self.seed, self.gen, self.live, self.cache.k, self.cache.v,
                self.rope_real, b, kv_len, p.temperature, p.top_k, p.top_p)

    def prefill(self, slots: List[int], prompts: List[List[int]], seeds: List[int]) -> Result:
        """Write each prompt's keys/values into its slot and sample its first token. Equal prompts
        (a GRPO group) are computed once and copied to every slot that takes them."""
        return self.start(slots, prompts, seeds, prefill_slots(self.model, self.cache, self.rope, slots, prompts))

    def step(self, b: int, kv_len: int) -> Result:
        """Decode one token for slots [0, b); `kv_len`: the longest live sequence, input token
        included (the step reads kv_bucket(kv_len) cache entries)."""
        kv = self.kv_bucket(kv_len)
        if self.mode in ("graphs", "compile"):
            out = self._graph(b, kv)()
        else:
            out = self.step_fn(*self._args(b, kv))
        vals = out.tolist()
        return [int(t) for t in vals[0]], vals[1]

    def _graph(self, b: int, kv: int) -> Callable[[], torch.Tensor]:
        if (b, kv) not in self._graphs:
            from elastic.generation.cuda_graphs import capture

            # Warm-up runs advance the state; capture restores it (the cache writes they make are
            # the ones the real step makes again).
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()  # one memory pool for every graph of the call
            try:
                self._graphs[b, kv] = capture(self.step_fn, self._args(b, kv), restore=[self.tok, self.pos, self.gen],
                                              pool=self._pool)
            except Exception as e:  # noqa: BLE001 - a compiler failure must not end a training run
                if self.step_fn is decode_step:
                    raise
                warnings.warn(f"generate: compiling the decode step failed ({type(e).__name__}: {e}); "
                              "capturing the uncompiled step instead (mode 'graphs')", RuntimeWarning)
                self.step_fn, self.mode = decode_step, "graphs"
                return self._graph(b, kv)
        return self._graphs[b, kv]

    def release(self, slots: List[int]) -> None:
        if slots:
            self.live[torch.tensor(slots, device=self.live.device)] = 0

    def move(self, src: List[int], dst: List[int]) -> None:
        """Move live slots `src` to free slots `dst` (cache and state)."""
        s = torch.tensor(src, device=self.tok.device)
        d = torch.tensor(dst, device=self.tok.device)
        self.cache.move(s, d)
        for t in (self.tok, self.pos, self.seed, self.gen, self.live):
            t[d] = t[s]
        self.live[s] = 0


class RecomputeDecoder:
    """No cache: every step runs each live sequence in full (right-padded, causal). The same
    sampling (seed, token index) as CachedDecoder, so the two give the same tokens."""

    def __init__(self, model: nn.Module, slots: int, capacity: int, params: SamplingParams):
        self.model, self.params, self.slots = model, params, slots
        self.rope = model.rope_table(model_device(model), capacity)
        self.seqs: List[Optional[List[int]]] = [None] * slots
        self.seeds = [0] * slots
        self.gens = [0] * slots

    admit_min = 1

    def bucket(self, live: int) -> int:
        return live

    def _sample(self, slots: List[int], logits: torch.Tensor) -> Result:
        dev = logits.device
        seed = torch.tensor([self.seeds[s] for s in slots], dtype=torch.long, device=dev)
        gen = torch.tensor([self.gens[s] for s in slots], dtype=torch.long, device=dev)
        nxt, logp = sample(logits, self.params, seed, gen)
        toks, lps = nxt.tolist(), logp.tolist()
        for s, t in zip(slots, toks):
            self.seqs[s].append(t)
            self.gens[s] += 1
        return toks, lps

    def prefill(self, slots: List[int], prompts: List[List[int]], seeds: List[int]) -> Result:
        for s, p, sd in zip(slots, prompts, seeds):
            self.seqs[s], self.seeds[s], self.gens[s] = list(p), sd, 0
        return self._sample(slots, last_logits(self.model, [list(p) for p in prompts], self.rope, PrefillAttention))

    def step(self, b: int, kv_len: int) -> Result:
        live = [s for s in range(b) if self.seqs[s] is not None]
        toks, lps = self._sample(live, last_logits(self.model, [self.seqs[s] for s in live], self.rope, PrefillAttention))
        out_t, out_l = [0] * b, [0.0] * b
        for s, t, lp in zip(live, toks, lps):
            out_t[s], out_l[s] = t, lp
        return out_t, out_l

    def release(self, slots: List[int]) -> None:
        for s in slots:
            self.seqs[s] = None

    def move(self, src: List[int], dst: List[int]) -> None:
        for s, d in zip(src, dst):
            self.seqs[d], self.seeds[d], self.gens[d] = self.seqs[s], self.seeds[s], self.gens[s]
            self.seqs[s] = None
