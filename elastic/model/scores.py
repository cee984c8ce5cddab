"""Sequence scores of a scalar-head model (`ModelArgs.num_labels` 1: reward model, critic),
pooled exactly as transformers' *ForSequenceClassification pools them.

transformers (GenericForSequenceClassification.forward, modeling_layers.py; Llama, Qwen2 and
Qwen3 all use it) runs the head on every position and takes, per row, the position

    argmax over t of  t * (input_ids[t] != pad_token_id)

i.e. the rightmost token that is not the pad id, found on the device (no host sync). Its
consequences, which hold here too:

* a row of only pad tokens gives index 0 (every product is 0 and argmax returns the first
  maximum): the score is the head at position 0, a pad token's state, not a meaningful value
  (mask such rows out yourself; no sync is spent detecting them);
* a pad id inside a row is never pooled: when pad == EOS (tokenizers without a pad token), a
  row ending in EOS is scored at the token before that EOS, in transformers and here;
* the rule also admits left padding in transformers (with an attention mask); here rows must be
  right-padded: `Transformer.forward` without a mask treats every token as context, which for a
  right-padded row changes nothing before its last real token (causal attention), so the score
  equals transformers' with or without its attention mask.

Only the pooled positions go through the head (`Transformer.forward(select=...)`): the
[B, T, 1] per-position scores are never built.
"""

from __future__ import annotations

import torch


def last_token_index(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """[B] int64: per row of `tokens` [B, T], the index of the rightmost token that is not
    `pad_id` (0 for a row of only pad tokens), transformers' rule (module doc). No host sync."""
    pos = torch.arange(tokens.shape[-1], device=tokens.device)
    return (pos * (tokens != pad_id)).argmax(-1)


def sequence_scores(model, tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """[B] fp32 scores of right-padded rows `tokens` [B, T]: the scalar head at each row's last
    non-pad token (`last_token_index`), the value transformers' *ForSequenceClassification
    returns as `logits[:, 0]` for the same model and ids. Differentiable; no host sync."""
    n = getattr(model.args, "num_labels", None)
    if n != 1:
        raise ValueError(f"sequence_scores: needs a scalar-head model (ModelArgs.num_labels 1), got num_labels {n}")
    B, T = tokens.shape
    flat = torch.arange(B, device=tokens.device) * T + last_token_index(tokens, pad_id)
    return model(tokens, select=flat)[:, 0].float()
