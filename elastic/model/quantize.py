"""QLoRA's frozen base in NF4 (`model.quantize_base: nf4`), through torchao's NF4 tensor.

The weights of every linear layer inside the transformer blocks (q k v o, gate up down) are
stored as 4-bit NormalFloat codes in blocks of 64 with double quantization (each block's absmax
quantized to int8 in blocks of up to 256), as in QLoRA (Dettmers et al. 2023). Embeddings,
norms and the output head stay in their dtype. The forward dequantizes the weight
to the input's dtype (bf16 on GPU, fp32 on CPU) just before the matmul, and again in backward
(torchao's `linear_nf4` saves the 4-bit weight, not a dequantized copy). The base never trains.

Why torchao (not bitsandbytes): it is plain PyTorch (runs wherever torch runs, CPU included),
its tensor is a `torch.Tensor` subclass that `nn.Linear`'s `F.linear` dispatches on, and it is
what torchtune uses for QLoRA. bitsandbytes + PEFT is the test reference (tests/test_qlora.py):
the block absmax equals bitsandbytes' bit for bit and so do the 4-bit codes, except for values
within 2e-5 of a code boundary (torchao's codebook is bnb's rounded to 4 decimals); the double
quantizations differ (torchao: int8 absmax after subtracting their mean; bnb: its dynamic 8-bit
map), so the two libraries' dequantized weights differ by up to about 1% of a block's absmax.

Under FSDP2 (elastic/train) these parameters are left out of sharding: every rank holds the
whole 4-bit base. Codes are always computed from a whole weight (`param.copy_(full)`), so they
do not depend on the world size.

One door: :func:`quantize_base` (a model's block linears → NF4 parameters); :func:`to_nf4`,
:func:`dequantize` and :func:`nf4_roundtrip` for export and tests. torchao is imported only
here, only when used. No Ray, no distribution here.
"""

from __future__ import annotations

import logging
from typing import Dict, Iterable, List, Set

import torch
import torch.nn as nn

QUANTIZE_BASE = ("none", "nf4")
BLOCK_SIZE = 64  # values per 4-bit block (one absmax each): QLoRA's, bitsandbytes' and torchao's default
SCALER_BLOCK_SIZE = 256  # absmax values per double-quantization block (QLoRA's 256)

_nf4 = None


def _lib():
    """torchao's NF4 module, imported on first use (its import logs that optional CUDA kernels
    and Triton are missing on CPU machines, and torch warns about an Enum it registers: those
    lines are silenced, they do not concern NF4)."""
    global _nf4
    if _nf4 is None:
        quiet = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
        levels = [lg.level for lg in quiet]
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        try:
            from torchao.quantization.quantize_.workflows.nf4 import nf4_tensor
        finally:
            for lg, lv in zip(quiet, levels):
                lg.setLevel(lv)
        _nf4 = nf4_tensor
    return _nf4


def scaler_block_size(numel: int) -> int:
    """The double-quantization block for a weight of `numel` values: 256 absmax values, or the
    largest power of two that divides its block count (small test models). Depends on the shape
    only, so the stored codes never depend on the world size."""
    if numel % BLOCK_SIZE:
        raise ValueError(f"NF4 needs a multiple of {BLOCK_SIZE} values per weight, got {numel}")
    n_blocks, s = numel // BLOCK_SIZE, SCALER_BLOCK_SIZE
    while n_blocks % s:
        s //= 2
    return s


def is_nf4(t) -> bool:
    return _nf4 is not None and isinstance(t, _nf4.NF4Tensor)


def to_nf4(w: torch.Tensor):
    """A full weight → torchao NF4Tensor (codes, block absmax, double quantization) of w's dtype."""
    w = w.detach().contiguous()
    return _lib().to_nf4(w, BLOCK_SIZE, scaler_block_size(w.numel()))


def dequantize(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An NF4 tensor's values (in its own dtype, or `dtype`); any other tensor unchanged."""
    if is_nf4(t):
        w = t.get_original_weight()
        return w.to(dtype) if dtype is not None else w
    return t if dtype is None else t.to(dtype)


def nf4_roundtrip(w: torch.Tensor) -> torch.Tensor:
    """What a QLoRA run computes with for the base weight `w`: dequantize(to_nf4(w)), w's dtype."""
    return dequantize(to_nf4(w)).to(w.dtype)


def _empty_nf4(shape: torch.Size, dtype: torch.dtype, device: torch.device):
    """An NF4Tensor of `shape` with zero codes, allocated on `device` (not meta: its codebook
    and scaler mean must survive `to_empty`); filled later by `copy_` of a full weight."""
    lib = _lib()
    numel = shape.numel()
    sbs = scaler_block_size(numel)
    n_blocks = numel // BLOCK_SIZE
    meta = lib.SubclassTensorArgs(shape, (shape[1], 1), 0, dtype, device, False)
    return lib.NF4Tensor(meta, BLOCK_SIZE, n_blocks, sbs,
                         torch.zeros(n_blocks, dtype=torch.int8, device=device),
                         torch.ones(n_blocks // sbs, dtype=dtype, device=device),
                         torch.zeros((), dtype=dtype, device=device),
                         torch.zeros(numel // 2, dtype=torch.uint8, device=device),
                         lib.to_nf4(torch.zeros(BLOCK_SIZE * 2, dtype=dtype), BLOCK_SIZE, 2).nf4.to(device))


def base_linears(model: nn.Module) -> Iterable[tuple[str, nn.Linear]]:
    """(name, module) of every linear layer inside the transformer blocks (adapted or not)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and (name.startswith("layers.") or ".layers." in name):
            yield name, m


def quantize_base(model: nn.Module, device: torch.device | str | None = None) -> Set[nn.Parameter]:
    """Store every block linear's weight in NF4 (in place; the bias, if any, stays as is) and
    return the new frozen parameters. A model on the meta device gets zero-code NF4 weights on
    `device`, to be filled with `param.copy_(full_weight)` (which quantizes it)."""
    out: Set[nn.Parameter] = set()
    for name, lin in list(base_linears(model)):
        w = lin.weight
        if is_nf4(w):
            out.add(w)
            continue
        if w.dim() != 2 or w.numel() % BLOCK_SIZE:
            raise ValueError(f"model.quantize_base: {name}.weight {tuple(w.shape)} is not a matrix of a multiple of "
                             f"{BLOCK_SIZE} values")
        if w.is_meta:
            q = _empty_nf4(w.shape, w.dtype, torch.device(device) if device is not None else torch.device("cpu"))
        else:
            q = to_nf4(w)
        lin.weight = nn.Parameter(q, requires_grad=False)
        out.add(lin.weight)
    if not out:
        raise ValueError("model.quantize_base: the model has no linear layers in its blocks")
    return out


def roundtrip_state(state: Dict[str, torch.Tensor], names: Iterable[str]) -> Dict[str, torch.Tensor]:
    """A full state dict whose `names` weights are replaced by their NF4 round trip (export of a
    QLoRA run: the base the adapters were trained on)."""
    out = dict(state)
    for n in names:
        if n in out:
            out[n] = nf4_roundtrip(out[n])
    return out


def block_weight_names(state: Dict[str, torch.Tensor]) -> List[str]:
    """The block linear weights of a full state dict (`layers.N.<attention|feed_forward>.<w>.weight`)."""
    return [k for k in state if k.startswith("layers.") and k.endswith(".weight") and k.split(".")[-2].startswith("w")
            and state[k].dim() == 2]


def stored_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds: an NF4 tensor's codes, scalers and codebook; else numel × element size."""
    if is_nf4(t):
        return sum(getattr(t, a).numel() * getattr(t, a).element_size()
                   for a in ("quantized_data", "quantized_scalers", "quantization_factor", "scaler_mean", "nf4"))
    return t.numel() * t.element_size()
