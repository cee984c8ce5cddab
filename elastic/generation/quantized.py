"""Weight-only quantized generation: a quantized copy of the policy that only generation uses.

    quant = QuantizedCopy("int8")           # once (per model being generated from)
    gen_model = quant.refresh(model)        # per rollout: the policy's current weights, quantized
    generate(gen_model, prompts, ...)

`model` is a plain `Transformer` (elastic/model), or an FSDP2 model whose parameters are gathered
(elastic/train/fsdp_generate.gathered_parameters); it is only read. The copy is a separate plain
`Transformer` in the model's dtype: every `nn.Linear` of the blocks (wq wk wv wo w1 w2 w3) holds
a torchao weight-only quantized weight, the embedding, the norms and the output head are copied
as they are. `refresh` copies and requantizes every weight each call: the trainer's weights
change every optimizer step, and quantizing costs a few matmul-free passes over the weights.
A LoRA policy (elastic/model/lora.py) is merged on the way (W + scaling · B A, in fp32) before
quantizing, so the copy generates with what the policy computes.

    full  no copy: `refresh` returns `model` itself.
    int8  torchao `Int8WeightOnlyConfig`: int8 per output channel (one scale per row); runs on
          CPU and CUDA, any dtype.
    int4  torchao `Int4WeightOnlyConfig` in the tinygemm layout (`tile_packed_to_4d`), groups of
          128 input features (64 or 32 when the width needs it): CUDA with bfloat16 only.
          torchao 0.18 has no CPU int4 weight-only kernel (its plain layout needs the CUDA
          `mslk` kernels, `plain_int32` refuses CPU, tinygemm needs CUDA), so on CPU `refresh`
          raises `QuantizationError` with one line saying so.

torchao is imported only when a copy is quantized (its import prints warnings about CUDA-only
extension libraries it cannot load on a CPU build; they are silenced here).
"""

from __future__ import annotations

import logging
import time
from typing import Dict, Optional

import torch
import torch.nn as nn

WEIGHTS = ("full", "int8", "int4")
# Module names whose weights are quantized (the blocks' linear layers).
TARGETS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
INT4_GROUPS = (128, 64, 32)
_CLEAN = ("_checkpoint_wrapped_module.", "_orig_mod.")


class QuantizationError(ValueError):
    """A weight setting that cannot run here (one line, for config errors)."""


def _torchao():
    """Import torchao's quantize_ API quietly (its CUDA-only .so files fail to load on CPU builds
    and it logs a warning per file)."""
    log = logging.getLogger("torchao")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as e:  # pragma: no cover - torchao is a core dependency
        raise QuantizationError(f"generation.weights needs torchao (pip install 'torchao>=0.18'): {e}") from None
    finally:
        log.setLevel(level)
    return quantize_, Int8WeightOnlyConfig, Int4WeightOnlyConfig


def check_weights(weights: str, device: torch.device, dtype: torch.dtype) -> None:
    """Raise QuantizationError (one line) when `weights` cannot run on this device and dtype."""
    if weights not in WEIGHTS:
        raise QuantizationError(f"generation.weights must be {'|'.join(WEIGHTS)}, got {weights!r}")
    if weights == "int4" and (device.type != "cuda" or dtype != torch.bfloat16):
        raise QuantizationError(
            f"generation.weights=int4 needs CUDA and bfloat16 weights (torchao 0.18 has no CPU int4 weight-only kernel; "
            f"here: {device.type}, {str(dtype).replace('torch.', '')}); use int8 or full")


def _clean(name: str) -> str:
    for c in _CLEAN:
        name = name.replace(c, "")
    return name


def source_tensors(model: nn.Module) -> Dict[str, torch.Tensor]:
    """The model's weights by clean name (no checkpoint/compile wrappers), LoRA adapters merged
    into their base weight; detached views, nothing is copied unless merged."""
    out: Dict[str, torch.Tensor] = {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if pname in ("lora_A", "lora_B"):
                continue
            key = _clean(f"{mname}.{pname}" if mname else pname)
            if type(p).__name__ == "DTensor":
                raise QuantizationError("generation.weights: the model's parameters are sharded; quantize inside "
                                        "elastic.train.fsdp_generate.gathered_parameters(model)")
            t = p.detach()
            if pname == "weight" and hasattr(mod, "lora_A") and getattr(mod, "lora_enabled", True):
                t = (t.float() + mod.scaling * (mod.lora_B.detach().float() @ mod.lora_A.detach().float())).to(t.dtype)
            out[key] = t
    return out


def _is_target(name: str) -> bool:
    return name.startswith("layers.") and name.endswith(".weight") and name.split(".")[-2] in TARGETS


class QuantizedCopy:
    """A weight-only quantized copy of a model for generation (see the module docstring)."""

    def __init__(self, weights: str = "full"):
        if weights not in WEIGHTS:
            raise QuantizationError(f"generation.weights must be {'|'.join(WEIGHTS)}, got {weights!r}")
        self.weights = weights
        self.model: Optional[nn.Module] = None
        self.refresh_s = 0.0   # seconds the last refresh took
        self.refreshes = 0

    def _config(self, in_features: int):
        _, int8, int4 = _torchao()
        if self.weights == "int8":
            return int8()
        group = next((g for g in INT4_GROUPS if in_features % g == 0), None)
        if group is None:
            raise QuantizationError(f"generation.weights=int4: a linear layer of width {in_features} is not a multiple of 32")
        return int4(group_size=group, int4_packing_format="tile_packed_to_4d")

    def _build(self, model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
        from elastic.model.llama import Transformer

        with torch.device("meta"):
            rep = Transformer(model.args, attention_backend=model.attention_backend)
        rep.to_empty(device=device)
        rep.to(dtype)
        rep.tie_weights()
        rep.init_buffers()
        rep.requires_grad_(False)
        rep.eval()
        return rep

    @torch.no_grad()
    def refresh(self, model: nn.Module) -> nn.Module:
        """The model to generate with: `model` itself for `full`; else this copy, rebuilt from
        `model`'s current weights and quantized. `model` is only read."""
        if self.weights == "full":
            return model
        t0 = time.perf_counter()
        src = source_tensors(model)
        ref = src["tok_embeddings.weight"]
        device, dtype = ref.device, ref.dtype
        check_weights(self.weights, device, dtype)
        if self.model is None or self.model.tok_embeddings.weight.device != device or \
                self.model.tok_embeddings.weight.dtype != dtype:
            self.model = self._build(model, device, dtype)
        rep = self.model
        quantize_ = _torchao()[0]
        log = logging.getLogger("torchao")
        level = log.level
        log.setLevel(logging.ERROR)  # int4: "skipping" messages are errors here (checked above)
        try:
            mods = dict(rep.named_modules())
            mine = {n: p for n, p in rep.named_parameters(remove_duplicate=False)}
            for name, t in src.items():
                if _is_target(name):
                    lin = mods[name.rsplit(".", 1)[0]]
                    lin.weight = nn.Parameter(t.to(dtype).clone(), requires_grad=False)
                    quantize_(lin, self._config(lin.in_features))
                elif name in mine:
                    mine[name].copy_(t)
                else:
                    raise QuantizationError(f"generation.weights: unexpected parameter {name} in the policy")
        finally:
            log.setLevel(level)
        self.refreshes += 1
        self.refresh_s = time.perf_counter() - t0
        return rep


def quantized_weight_bytes(model: nn.Module) -> int:
    """Bytes the model's parameters hold (a quantized weight counts its int data and scales)."""
    total = 0
    for p in model.parameters():
        inner = [getattr(p, a) for a in getattr(p, "tensor_data_names", ()) if isinstance(getattr(p, a, None), torch.Tensor)]
        if inner:
            total += sum(t.numel() * t.element_size() for t in inner)
        else:
            total += p.numel() * p.element_size()
    return total
