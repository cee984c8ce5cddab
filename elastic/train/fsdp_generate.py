"""Generation on an FSDP2-sharded model inside a train worker: gather once, decode locally.

Every rank generates its own prompts (different counts, lengths and stop times). Left to
itself FSDP2 would all-gather each block's parameters in its forward and free them after,
one collective per block per decode step; ranks that stop after different numbers of steps
would then wait on each other's collectives forever. So for the whole `generate()` call:

1. every FSDP module (each block, then the root) is told not to reshard after forward
   (`set_reshard_after_forward(False)`) and is unsharded (`unshard()`): one all-gather per
   module, issued in the same order on every rank — the only collectives of the call;
2. generation runs on the unsharded parameters and issues no collective, so ranks may run any
   number of steps (tests/test_generate_fsdp.py checks this with torch.profiler and with ranks
   whose step counts differ); a caller that goes through the root forward instead
   (generate_reference) finds each module already unsharded, and its hooks do nothing;
3. the previous reshard-after-forward setting is restored and every module is resharded
   (local: it only frees the gathered copies).

The generation engine (elastic/generation/generate.py) needs this: it runs each block's own
`forward`, not the module call, so no FSDP hook runs at all during decoding (hooks would also
break its compiled, graph-captured decode step at every block); it refuses a model whose
parameters are still sharded.

Memory: the full parameters in `param_dtype` (MixedPrecisionPolicy) live on every rank for
the duration of the call, plus the KV cache. Generation computes in that dtype. With
`weights="int8"|"int4"` (generation.weights) the gathered weights are quantized into a separate
copy kept on the model between calls (elastic/generation/quantized.py) and generation runs on
that; the gathered and trained weights are only read.
Must be entered by all ranks together (step 1 is collective).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from elastic.generation.episodes import Episode, play_episodes
from elastic.generation.generate import Completion, generate
from elastic.generation.quantized import QuantizedCopy


def _fsdp_modules(model: nn.Module) -> List[FSDPModule]:
    # Children before the root: the same order on every rank.
    return [m for m in reversed(list(model.modules())) if isinstance(m, FSDPModule)]


def _post_forward_settings(mod: FSDPModule) -> List[Any]:
    # The public setter has no getter; keep the private fields it writes, to restore them
    # exactly (the root's "auto" mode included).
    state = mod._get_fsdp_state()
    return [state._auto_reshard_after_forward, [g.post_forward_mesh_info for g in state._fsdp_param_groups]]


def _restore_post_forward(mod: FSDPModule, saved: List[Any]) -> None:
    state = mod._get_fsdp_state()
    state._auto_reshard_after_forward = saved[0]
    for g, info in zip(state._fsdp_param_groups, saved[1]):
        g.post_forward_mesh_info = info


def _tensor_parallel(model: nn.Module) -> bool:
    p = next(model.parameters(), None)
    mesh = getattr(p, "device_mesh", None)
    return mesh is not None and "tp" in (mesh.mesh_dim_names or ())


def _replica(model: nn.Module) -> nn.Module:
    """A plain copy of a tensor-parallel model, every parameter whole, in the compute dtype.

    Under TP, unsharding FSDP still leaves each block's matmuls split over the tp ranks, whose
    collectives would tie the ranks' decode steps together. So the whole weights are gathered
    (`full_tensor`: one collective per parameter, the same order on every rank) into a plain
    model kept on `model` between calls, and generation runs on that."""
    import torch

    state = model._get_fsdp_state() if isinstance(model, FSDPModule) else None
    dtype = (state._mp_policy.param_dtype if state is not None else None) or next(model.parameters()).dtype
    rep = getattr(model, "_elastic_replica", None)
    if rep is None:
        with torch.device("meta"):
            rep = type(model)(model.args, attention_backend=model.attention_backend)
        device = next(model.parameters()).to_local().device
        rep.to_empty(device=device)
        rep.to(dtype)
        rep.tie_weights()
        rep.init_buffers()
        rep.requires_grad_(False)
        object.__setattr__(model, "_elastic_replica", rep)  # not a submodule: no FSDP, no state dict
    mine = dict(rep.named_parameters())
    with torch.no_grad():
        for name, p in model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            mine[name].copy_(full)
    return rep


@contextmanager
def gathered_parameters(model: nn.Module) -> Iterator[nn.Module]:
    """Unshard every FSDP module of `model` for the duration of the block (collective on
    entry; nothing collective inside; local resharding on exit). A no-op for plain models.
    Under tensor parallelism: a plain whole copy instead (`_replica`); the caller must use the
    module yielded."""
    if _tensor_parallel(model):
        yield _replica(model)
        return
    mods = _fsdp_modules(model)
    saved = [_post_forward_settings(m) for m in mods]
    try:
        for m in mods:
            m.set_reshard_after_forward(False, recurse=False)
        for m in mods:
            m.unshard()
        yield model
    finally:
        for m, s in zip(mods, saved):
            _restore_post_forward(m, s)
        for m in mods:
            m.reshard()


def quantized_copy(model: nn.Module, weights: str) -> QuantizedCopy:
    """The model's quantized generation copy (generation.weights), kept on the model between
    calls (not a submodule: no FSDP, no state dict, no optimizer)."""
    q = getattr(model, "_elastic_quantized", None)
    if q is None or q.weights != weights:
        q = QuantizedCopy(weights)
        object.__setattr__(model, "_elastic_quantized", q)
    return q


def fsdp_generate(model: nn.Module, prompts: List[List[int]], max_new_tokens: int, weights: str = "full",
                  **kwargs: Any) -> List[Completion]:
    """`elastic.generation.generate.generate` on a sharded model; all ranks call it together,
    each with its own prompts. `weights` (generation.weights): full, or int8 / int4 to generate
    with a weight-only quantized copy made from the gathered weights on this call
    (elastic/generation/quantized.py); the model's own weights are only read."""
    with gathered_parameters(model) as whole:
        gen = quantized_copy(model, weights).refresh(whole) if weights != "full" else whole
        return generate(gen, prompts, max_new_tokens, **kwargs)


def fsdp_generate_turns(model: nn.Module, prompts: List[List[int]], max_new_tokens: int, turns: int,
                        respond: Callable[[List[Tuple[int, int, Completion]], bool], Dict[int, Optional[List[int]]]],
                        max_total_tokens: Optional[int] = None, **kwargs: Any) -> List[Episode]:
    """Multi-turn episodes (elastic/generation/episodes.py `play_episodes`: EpisodeBatch, one
    `respond(answered, last)` call per round) on a sharded model; all ranks call it together,
    each with its own prompts. Parameters are gathered once around the whole round loop (the
    only collectives), so ranks may run different numbers of rounds and steps, and `respond` may
    block (on the reward pool) for as long as it likes."""
    with gathered_parameters(model) as whole:
        if not prompts:  # a rank with nothing to generate still takes part in the gather
            return []
        return play_episodes(whole, prompts, max_new_tokens, turns, respond, max_total_tokens=max_total_tokens, **kwargs)
