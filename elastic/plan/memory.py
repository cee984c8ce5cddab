"""The memory model of one training step on one GPU, by layout (elastic/train/mesh.py).

Bytes per GPU, each term with its formula (N parameters, B one block's parameters, E the
embedding and output parameters, t = seq_len x micro_batch tokens, h dim, k key/value width
n_kv_heads x head_dim, f ffn_hidden, V vocabulary, L layers, c the compute dtype's bytes):

  state        16 N / (dp_shard x tp)      fp32 parameters 4 + fp32 gradients 4 + AdamW moments 8,
                                           sharded by FSDP over dp_shard and by TP over tp
                                           (HSDP replicas each hold a full sharded copy)
  gathered     c (2 B + E) / tp            FSDP's compute-dtype copies: the running block, the
                                           next one prefetched, the root's embeddings and output
  block grads  4 B / tp                    one block's unsharded fp32 gradient before its
                                           reduce-scatter
  activations  c t (8 h + 2 k + 4 f + 4 d_h + H + 2) / tp per block, saved for backward
                                           (d_h head_dim, H heads; element counts measured on
                                           CPU, exactly: tests/test_plan.py), x L; with
                                           activation checkpointing c t h / tp per block (its
                                           input) x L, plus one block's full set while it is
                                           recomputed
  logits       t V (c + 4 + 4) / tp        the logits, their fp32 upcast for the loss and its
                                           gradient: vocabulary shards under loss parallelism
                                           (parallel.loss_parallel, elastic/train/parallelize.py);
                                           whole (no / tp) on a pipeline's last stage, which
                                           gathers them

plus a reserve of 10% and 1 GiB (CUDA context, allocator fragmentation, communication
buffers). Sequence parallelism divides the activations by tp (each rank keeps T/tp positions
of the norms and the residual stream); attention is assumed to keep no T x T matrix (flash,
flex or the per-document backends).

Pipeline parallelism (pp stages of L/pp blocks, elastic/train/pipeline.py; 1F1B with at least pp
micro-batches of `micro_batch` sequences) changes the terms of the worst stage, an end stage:

  state        16 (L/pp B + V h + h) / (dp_shard x tp)   its blocks and one of embedding/output
  gathered     c (2 B + V h + h) / tp
  activations  1F1B keeps up to pp micro-batches in flight on the first stage: pp x L/pp blocks'
               worth = the same L x per-block term as without pp (with activation
               checkpointing pp x L/pp block inputs + one block's full set)
  p2p          2 c t h / tp                 the activation received and the gradient sent

so at a fixed GPU count pp lowers the state only as much as sharding over the same GPUs would;
its use is keeping FSDP's all-gathers inside a node (pp x tp across nodes, see
docs/parallelism.md). `plan` ranks pp > 1 after every layout without it that fits. The estimate
is an upper bound of what FSDP2 holds at once, not a measurement on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

from elastic.config.presets import PRESETS

GIB = 2**30
# Shapes the planner knows besides the presets (Llama 3.1 70B; its vocabulary below).
SHAPES: Dict[str, Dict] = {
    **PRESETS,
    "70b": dict(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672, tie_embeddings=False),
}
VOCAB = {"tiny": 32000, "125m": 32000, "1b": 128256, "8b": 128256, "70b": 128256}
RESERVE_FRAC, RESERVE_BYTES = 0.10, 1 * GIB


@dataclass(frozen=True)
class LayoutSpec:
    """dp_replicate x dp_shard x tp x pp GPUs; activation checkpointing on or off."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    ac: bool = False
    pp: int = 1

    @property
    def gpus(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp


@dataclass
class Footprint:
    layout: LayoutSpec
    parts: Dict[str, float] = field(default_factory=dict)  # bytes per GPU, by term

    @property
    def total(self) -> float:
        raw = sum(self.parts.values())
        return raw * (1 + RESERVE_FRAC) + RESERVE_BYTES

    def fits(self, gpu_bytes: float) -> bool:
        return self.total <= gpu_bytes


def shape_params(s: Dict, vocab: int) -> Dict[str, int]:
    """N, B (one block), E (embeddings + output) of a shape (ModelArgs fields)."""
    d, heads, kvh, f = s["dim"], s["n_heads"], s["n_kv_heads"], s["ffn_hidden"]
    hd = s.get("head_dim") or d // heads
    block = d * heads * hd * 2 + d * kvh * hd * 2 + 3 * d * f + 2 * d
    emb = vocab * d * (1 if s.get("tie_embeddings", True) else 2)
    return {"N": s["n_layers"] * block + emb + d, "B": block, "E": emb + d}


def activation_elements_per_token(s: Dict) -> float:
    """Elements one block saves for backward per token (the measured counts)."""
    d, heads, kvh, f = s["dim"], s["n_heads"], s["n_kv_heads"], s["ffn_hidden"]
    hd = s.get("head_dim") or d // heads
    # q, k/v-sized, ffn-sized tensors; the RoPE cos/sin; per-head softmax statistics; the two
    # norms' statistics (measured: tests/test_plan.py).
    return 8 * d + 2 * kvh * hd + 4 * f + 4 * hd + heads + 2


def footprint(s: Dict, vocab: int, layout: LayoutSpec, seq_len: int, micro_batch: int,
              compute_bytes: int = 2) -> Footprint:
    """Bytes per GPU of one training step at `layout` (module docstring: the terms)."""
    p = shape_params(s, vocab)
    tp, pp, c, L, h = layout.tp, layout.pp, compute_bytes, s["n_layers"], s["dim"]
    if L % pp:
        raise ValueError(f"pp={pp} does not divide {L} layers")
    t = seq_len * micro_batch
    block_act = c * t * activation_elements_per_token(s) / tp
    if layout.ac:
        acts = L * c * t * h / tp + block_act  # pp x L/pp block inputs in flight (1F1B) = L
    else:
        acts = L * block_act
    # the worst stage: all of it at pp 1, else an end stage (its blocks and the embedding or the output)
    ends = p["E"] if pp == 1 else vocab * h + h
    parts = {
        "state": 16 * (L // pp * p["B"] + ends) / (layout.dp_shard * tp),
        "gathered": c * (2 * p["B"] + ends) / tp,
        "block_grads": 4 * p["B"] / tp,
        "activations": acts,
        "logits": t * vocab * (c + 4 + 4) / (tp if pp == 1 else 1),
    }
    if pp > 1:
        parts["p2p"] = 2 * c * t * h / tp
    return Footprint(layout, parts)


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts_for(s: Dict, gpus: int, max_tp: int = 8, max_pp: int = 1) -> Iterable[LayoutSpec]:
    """Every layout of `gpus` GPUs: tp dividing the heads, key/value heads and ffn (at most
    `max_tp`, one node), pp dividing the layers (at most `max_pp`), the rest FSDP or HSDP; each
    with activation checkpointing off and on."""
    for pp in _divisors(gpus):
        if pp > max_pp or s["n_layers"] % pp:
            continue
        for tp in _divisors(gpus // pp):
            if tp > max_tp or s["n_heads"] % tp or s["n_kv_heads"] % tp or s["ffn_hidden"] % tp:
                continue
            dp = gpus // (tp * pp)
            for rep in _divisors(dp):
                for ac in (False, True):
                    yield LayoutSpec(rep, dp // rep, tp, ac, pp)


def plan(s: Dict, vocab: int, gpus: int, gpu_gib: float, seq_len: int, micro_batch: int,
         compute_bytes: int = 2, max_tp: int = 8, max_pp: int = 1) -> List[Footprint]:
    """Every layout's footprint, those that fit first; among them the least sharding first
    (no pipeline, then fewer tp ranks, then fewer shards: less communication and no bubble)."""
    out = [footprint(s, vocab, lay, seq_len, micro_batch, compute_bytes) for lay in layouts_for(s, gpus, max_tp, max_pp)]
    gpu_bytes = gpu_gib * GIB
    return sorted(out, key=lambda fp: (not fp.fits(gpu_bytes), fp.layout.pp, fp.layout.tp, fp.layout.ac,
                                       fp.layout.dp_shard, fp.total))


def table(rows: List[Footprint], gpu_gib: float, limit: Optional[int] = None) -> List[str]:
    """Markdown rows: layout, each term and the total in GiB, fits."""
    lines = ["| dp_replicate | dp_shard | tp | act. ckpt | pp | state | gathered | block grads | activations | logits | total GiB | fits |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for fp in rows[:limit]:
        L, q = fp.layout, {k: v / GIB for k, v in fp.parts.items()}
        lines.append(f"| {L.dp_replicate} | {L.dp_shard} | {L.tp} | {'on' if L.ac else 'off'} | {L.pp} | {q['state']:.1f} | "
                     f"{q['gathered']:.1f} | {q['block_grads']:.1f} | {q['activations']:.1f} | {q['logits']:.1f} | "
                     f"{fp.total / GIB:.1f} | {'yes' if fp.fits(gpu_gib * GIB) else 'no'} |")
    return lines
