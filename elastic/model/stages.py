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

from typing import List, Optional

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
