"""LoRA adapters in plain PyTorch (PEFT's LoRA, the interface people know).

A target projection computes ``W x + b + (alpha / rank) · B (A dropout(x))`` with ``A [rank, in]``
and ``B [out, rank]``. Only A and B train; the base weights are frozen.

Why the adapter lives *inside* the linear layer (:class:`LoRALinear` subclasses ``nn.Linear``):
the base tensors keep their names (``layers.0.attention.wq.weight``), so the Hugging Face key
map, our checkpoints and ``model.init_from`` loading see exactly the tensors they see without
adapters, and the adapters are two more parameters of the same transformer block, so FSDP2
shards and gathers them with the block. Adapter state-dict keys end in ``.lora_A`` / ``.lora_B``.

Initialisation follows PEFT's default (``init_lora_weights=True``): A ~ kaiming-uniform(a=√5),
i.e. U(-1/√in, 1/√in), and B = 0, so a fresh adapter leaves the model's output unchanged. The
full values are drawn from one generator in parameter order (like ``Transformer.init_weights``),
so a sharded model gets the same adapters at any world size.

:func:`adapters_disabled` runs the base model (the DPO/GRPO reference under LoRA: no second copy
of the weights). :func:`merge_state` folds adapters into full weights (export); :func:`peft_state`
renames them to PEFT's ``adapter_model.safetensors`` layout. No Ray, no distribution here.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

TARGETS: Tuple[str, ...] = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")
# Our projection name → the Hugging Face / PEFT module name (target_modules).
HF_MODULE = {"wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj",
             "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_HF_PARENT = {"wq": "self_attn", "wk": "self_attn", "wv": "self_attn", "wo": "self_attn",
              "w1": "mlp", "w2": "mlp", "w3": "mlp"}
ADAPTER_SUFFIXES = (".lora_A", ".lora_B")


@dataclass(frozen=True)
class LoRAConfig:
    rank: int
    alpha: float = 16.0
    dropout: float = 0.0
    targets: Tuple[str, ...] = TARGETS

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_section(cls, section) -> Optional["LoRAConfig"]:
        """From `cfg.model.lora` (or its dict form in a run's config.json); None when rank is 0."""
        get = section.get if isinstance(section, dict) else lambda k, d=None: getattr(section, k, d)
        rank = int(get("rank", 0) or 0)
        if rank <= 0:
            return None
        return cls(rank, float(get("alpha", 16.0)), float(get("dropout", 0.0)), tuple(get("targets", TARGETS)))


class LoRALinear(nn.Linear):
    """``nn.Linear`` plus a low-rank adapter; `weight` and `bias` keep their names."""

    def __init__(self, in_features: int, out_features: int, bias: bool, rank: int, alpha: float, dropout: float = 0.0,
                 device=None, dtype=None, adapter_dtype: torch.dtype = torch.float32):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.rank, self.scaling = rank, alpha / rank
        self.lora_A = nn.Parameter(torch.zeros(rank, in_features, device=device, dtype=adapter_dtype))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, device=device, dtype=adapter_dtype))
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_enabled = True

    @classmethod
    def wrap(cls, linear: nn.Linear, lora: LoRAConfig) -> "LoRALinear":
        """A LoRALinear around `linear`'s own weight and bias Parameters (shared, not copied)."""
        w = linear.weight
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, lora.rank, lora.alpha, lora.dropout,
                device=w.device, dtype=w.dtype)
        m.weight = w
        if linear.bias is not None:
            m.bias = linear.bias
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if not self.lora_enabled:
            return y
        a = self.lora_A.to(x.dtype)
        b = self.lora_B.to(x.dtype)
        return y + F.linear(F.linear(self.lora_dropout(x), a), b) * self.scaling

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, scaling={self.scaling:g}"


def _targets(model: nn.Module, names: Sequence[str]) -> Iterator[Tuple[str, nn.Module, str, nn.Linear]]:
    """(full name, parent module, attribute, linear) of every target projection, in module order."""
    for pname, parent in model.named_modules():
        for attr in names:
            child = getattr(parent, attr, None)
            if isinstance(child, nn.Linear) and attr in parent._modules:
                yield (f"{pname}.{attr}" if pname else attr), parent, attr, child


def apply_lora(model: nn.Module, lora: LoRAConfig) -> nn.Module:
    """Put adapters on every `lora.targets` projection (in place; works on the meta device, before
    FSDP wraps the blocks) and freeze everything else. Returns the model."""
    bad = [t for t in lora.targets if t not in TARGETS]
    if bad:
        raise ValueError(f"LoRA targets {bad}: unknown (known: {', '.join(TARGETS)})")
    found = 0
    for _, parent, attr, lin in list(_targets(model, lora.targets)):
        if not isinstance(lin, LoRALinear):
            setattr(parent, attr, LoRALinear.wrap(lin, lora))
            found += 1
    if not found:
        raise ValueError(f"LoRA targets {list(lora.targets)}: no such linear layers in the model")
    freeze_base(model)
    return model


def is_adapter_key(name: str) -> bool:
    """A state-dict key (ours, or DCP's `model.`-prefixed one) of an adapter tensor."""
    return name.endswith(ADAPTER_SUFFIXES)


def has_adapters(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def freeze_base(model: nn.Module) -> None:
    """Only adapter tensors train."""
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter_key(name))


def adapter_parameters(model: nn.Module) -> Dict[str, nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if is_adapter_key(n)}


def init_adapters(model: nn.Module, seed: Optional[int] = None,
                  assign: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None) -> None:
    """PEFT's default init (A kaiming-uniform, B zero), full values from one generator in
    parameter order; `assign(param, full)` stores them (a sharded model keeps its shard)."""
    g = torch.Generator().manual_seed(int(seed) + 0x10A) if seed is not None else None
    assign = assign or (lambda p, v: p.copy_(v))
    for name, p in model.named_parameters():
        if name.endswith(".lora_A"):
            bound = 1.0 / math.sqrt(p.shape[1])
            full = (torch.rand(p.shape, generator=g) * 2 - 1) * bound
        elif name.endswith(".lora_B"):
            full = torch.zeros(p.shape)
        else:
            continue
        with torch.no_grad():
            assign(p, full.to(p.dtype))


@contextlib.contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the frozen base: every adapter contributes nothing inside the block."""
    mods = [m for m in model.modules() if isinstance(m, LoRALinear)]
    before = [m.lora_enabled for m in mods]
    for m in mods:
        m.lora_enabled = False
    try:
        yield model
    finally:
        for m, b in zip(mods, before):
            m.lora_enabled = b


def trainable_counts(model: nn.Module) -> Tuple[int, int]:
    """(trainable, total) parameter counts (a tied matrix counted once)."""
    seen, trainable, total = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


# ------------------------------------------------------------------ full state dicts (export)

def adapter_pairs(state: Dict[str, torch.Tensor]) -> Dict[str, Tuple[torch.Tensor, torch.Tensor]]:
    """Base weight name → (A, B) for every adapter in a state dict."""
    out = {}
    for k, a in state.items():
        if k.endswith(".lora_A"):
            stem = k[: -len(".lora_A")]
            b = state.get(stem + ".lora_B")
            if b is None:
                raise ValueError(f"adapter {k} has no matching {stem}.lora_B")
            out[stem + ".weight"] = (a, b)
    return out


def merge_state(base: Dict[str, torch.Tensor], adapters: Dict[str, torch.Tensor], scaling: float) -> Dict[str, torch.Tensor]:
    """Base state dict + adapters → full weights ``W + scaling · B A`` (computed in float32, stored
    in W's dtype); no adapter keys in the result."""
    out = {k: v for k, v in base.items() if not is_adapter_key(k)}
    for wname, (a, b) in adapter_pairs(adapters).items():
        if wname not in out:
            raise ValueError(f"adapter for {wname}: the base has no such weight")
        w = out[wname]
        out[wname] = (w.float() + scaling * (b.float() @ a.float())).to(w.dtype)
    return out


def hf_adapter_prefix(name: str) -> str:
    """Our base weight name `layers.3.attention.wq.weight` → PEFT's module path
    `base_model.model.model.layers.3.self_attn.q_proj`."""
    parts = name.split(".")
    if len(parts) != 5 or parts[0] != "layers" or parts[3] not in HF_MODULE:
        raise ValueError(f"{name}: not an adapted projection")
    i, ours = parts[1], parts[3]
    return f"base_model.model.model.layers.{i}.{_HF_PARENT[ours]}.{HF_MODULE[ours]}"


def peft_state(adapters: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """Our adapter tensors → PEFT's saved names (`...q_proj.lora_A.weight`, same shapes)."""
    out = {}
    for wname, (a, b) in adapter_pairs(adapters).items():
        prefix = hf_adapter_prefix(wname)
        out[f"{prefix}.lora_A.weight"] = a.detach().contiguous()
        out[f"{prefix}.lora_B.weight"] = b.detach().contiguous()
    return out


def peft_config(lora: LoRAConfig, base_model: str) -> Dict[str, object]:
    """adapter_config.json for `peft.PeftModel.from_pretrained` (scaling = lora_alpha / r)."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
        "target_modules": sorted(HF_MODULE[t] for t in lora.targets), "bias": "none",
        "fan_in_fan_out": False, "init_lora_weights": True, "use_rslora": False, "use_dora": False,
        "modules_to_save": None, "inference_mode": True, "layers_to_transform": None,
    }
