"""Pipeline stages of the Transformer: a contiguous run of layers each, parameter names kept.

Issue 59's rule: a stage's parameters carry the *full* model's names (`layers.5.attention.wq.weight`
on whichever stage holds layer 5), so a DCP checkpoint written at one pipeline layout is read at
any other, and the Hugging Face name map (elastic/model/hf.py) applies unchanged. The layers sit
in a ModuleDict keyed by their global index (torchtitan's trick: a ModuleList would renumber).

The first stage embeds the tokens; the last applies the final norm and the output projection.
Every stage gets the packed batch's `positions` and `doc_ids` (the pipeline schedule hands
keyword inputs to all stages), so RoPE and document-masked attention match the whole model's.
A tied output projection (model.tie_embeddings) lives on two stages as two copies of one value:
the first stage's embedding and the last stage's `output.weight` (same initial value); whoever
runs the stages sums their gradients (elastic/train/pipeline.py `sync_tied_grads`).

Nothing here communicates: the schedule, send/recv and groups are elastic/train/pipeline.py's.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch
import torch.nn as nn

from elastic.model.attention import build_attention_metadata
from elastic.model.llama import Transformer


def stage_ranges(n_layers: int, n_stages: int) -> List[range]:
    """The layers of each stage, in order: [n_layers / n_stages] each. Uneven splits are refused
    (the loss of a stage that waits on a longer one is bubble; the config layer names the key)."""
    if n_stages < 1 or n_layers % n_stages:
        raise ValueError(f"{n_layers} layers do not split into {n_stages} equal pipeline stages")
    k = n_layers // n_stages
    return [range(s * k, (s + 1) * k) for s in range(n_stages)]


class TransformerStage(nn.Module):
    """Stage `index` of `n_stages` of `model` (whose modules it takes over, not copies).

    forward(x, positions, doc_ids): x is tokens [B, T] on the first stage, the hidden state
    [B, T, dim] elsewhere; returns the hidden state, or logits [B, T, vocab] on the last stage."""

    def __init__(self, model: Transformer, index: int, n_stages: int):
        super().__init__()
        a = model.args
        self.args = a
        self.attention_backend = model.attention_backend
        self.index, self.n_stages = index, n_stages
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        layers = stage_ranges(a.n_layers, n_stages)[index]
        self.tok_embeddings: Optional[nn.Embedding] = model.tok_embeddings if self.is_first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layers})
        self.norm = model.norm if self.is_last else None
        self.output: Optional[nn.Linear] = None
        if self.is_last:
            self.output = model.output
            if a.tie_embeddings and not self.is_first:  # its own copy: the first stage keeps the embedding
                self.output.weight = nn.Parameter(model.tok_embeddings.weight.detach().clone())
        self.freqs_cis = model.freqs_cis  # a plain attribute, as on the Transformer

    rope_table = Transformer.rope_table

    def forward(self, x: torch.Tensor, positions: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.is_first else x
        T = positions.shape[1]
        meta = build_attention_metadata(doc_ids, self.attention_backend)
        freqs = self.rope_table(positions.device, T)[positions]
        for layer in self.layers.values():
            h = layer(h, freqs, meta)
        if self.is_last:
            return self.output(self.norm(h))
        return h


def split_stages(model: Transformer, n_stages: int, indices: List[int]) -> List[TransformerStage]:
    """The stages `indices` (this rank's: one, or several virtual stages) of `model` split into
    `n_stages`. Modules of other stages are left to the caller to drop (build on the meta device
    and materialise only the returned stages)."""
    stage_ranges(model.args.n_layers, n_stages)  # refuses an uneven split before anything is built
    return [TransformerStage(model, i, n_stages) for i in indices]


class StageModel(nn.Module):
    """One pipeline rank's stages (one, or several virtual ones) as one module whose parameters
    carry the full model's names: `tok_embeddings` (first stage), `layers` (a ModuleDict of the
    held layers by global index), `norm` and `output` (last stage). It is what the optimizer,
    the checkpoint (DCP, by name: any layout reads it) and the weight loaders see; the pipeline
    schedule runs `stages` (registered under the same names, not as children of their own).

    `args`, `attention_backend` and `num_params` mirror the Transformer's."""

    def __init__(self, model: Transformer, n_stages: int, indices: List[int]):
        super().__init__()
        self.args = model.args
        self.attention_backend = model.attention_backend
        self.n_stages, self.indices = n_stages, list(indices)
        stages = split_stages(model, n_stages, indices)
        object.__setattr__(self, "stages", stages)  # a plain list: their modules are registered below
        self.has_first = any(s.is_first for s in stages)
        self.has_last = any(s.is_last for s in stages)
        self.collect()

    def collect(self) -> None:
        """(Re)register the stages' modules under the full model's names: after a wrapper has
        replaced some (activation checkpointing wraps each layer), this module sees the same."""
        stages = self.stages
        if self.has_first:
            self.tok_embeddings = next(s for s in stages if s.is_first).tok_embeddings
        self.layers = nn.ModuleDict({k: v for s in stages for k, v in s.layers.items()})
        if self.has_last:
            last = next(s for s in stages if s.is_last)
            self.norm, self.output = last.norm, last.output

    def checkpoint_aliases(self) -> dict:
        """{name: stored name} for a parameter a checkpoint may hold under another name: a tied
        last stage's `output.weight` copy is the embedding (an unsplit model's optimizer state
        names it `tok_embeddings.weight`; both copies' states are equal, their gradients summed)."""
        if self.args.tie_embeddings and self.has_last and not self.has_first:
            return {"output.weight": "tok_embeddings.weight"}
        return {}

    def num_params(self, exclude_embeddings: bool = True) -> int:
        """This rank's parameters (a tied last stage's `output.weight` copy counts here)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and self.has_first:
            n -= self.tok_embeddings.weight.numel()
        return n


def init_stage_weights(stage_model: StageModel, seed: Optional[int],
                       assign: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None) -> None:
    """The weights `Transformer.init_weights(seed)` gives the whole model, for the parameters
    this rank's stages hold: the draws run over a meta copy of the whole model in its parameter
    order (so they do not depend on the layout), and each held parameter keeps its value. A tied
    last stage's `output.weight` copy gets the embedding's value."""
    a = stage_model.args
    with torch.device("meta"):
        whole = Transformer(a, attention_backend=stage_model.attention_backend)
    names = {id(p): n for n, p in whole.named_parameters()}
    held = dict(stage_model.named_parameters())
    put = assign or (lambda p, v: p.copy_(v))
    copy_of_embedding = a.tie_embeddings and not stage_model.has_first and "output.weight" in held

    def keep(p: torch.Tensor, value: torch.Tensor) -> None:
        name = names[id(p)]
        if name in held:
            put(held[name], value)
        if copy_of_embedding and name == "tok_embeddings.weight":
            put(held["output.weight"], value)

    whole.init_weights(seed=seed, assign=keep)
