"""Hugging Face format in and out: LlamaForCausalLM (incl. Llama 3.1/3.2 "llama3" RoPE
scaling), Qwen2ForCausalLM and Qwen3ForCausalLM directories, and their *ForSequenceClassification
with one label (reward models, critics: `ModelArgs.num_labels` 1).

Our Transformer has HF's layout (rotate-half RoPE, Qwen2's q/k/v biases, Qwen3's per-head q/k
RMSNorm and explicit head_dim, tied or untied output), so a weight maps by its name alone:
`hf_key_map(args)` is that map, ours → HF. Which HF class a model is follows from its fields:
qk_norm → Qwen3, qkv_bias → Qwen2, else Llama (`hf_architecture_for`); a scalar head makes it
the family's *ForSequenceClassification, whose bias-free `score.weight` [1, dim] is our
`output.weight` (never tied). Its config.json carries num_labels 1 (id2label/label2id as
transformers writes them) and the pad_token_id transformers needs to find each row's last
non-pad token (elastic/model/scores.py pools the same token).

In:  `read_hf_dims(dir)` → ModelArgs fields from config.json (elastic/config/hf_config.py);
     `check_hf_dir(dir, args)` → every expected tensor present with the right shape, read
     from the safetensors headers only (no tensor data), one-line ConfigError otherwise;
     `load_hf_state_dict(dir, args)` → our state dict; `from_pretrained(path)` → a model.
Out: `save_hf(state_dict, args, out_dir, ...)` → config.json, safetensors (sharded with an
     index above `max_shard_bytes`, 5 GB by default), generation_config.json and tokenizer
     files; `export_checkpoint(step_dir, out_dir)` does it for one of our DCP checkpoints.
     transformers' `from_pretrained` loads the result; transformers itself is not needed here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
from typing import Any, Dict, List, Optional, Tuple

import torch

from elastic.config.hf_config import HFConfigError, hf_model_dims
from elastic.config.load import ConfigError
from elastic.model.llama import ModelArgs, Transformer

MAX_SHARD_BYTES = 5 * 10**9
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# Tensors some HF checkpoints carry that are not weights (old Llama saves kept RoPE's table).
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)
_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

_LAYER_MAP = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_BIAS_MAP = {"attention.wq.bias": "self_attn.q_proj.bias", "attention.wk.bias": "self_attn.k_proj.bias",
             "attention.wv.bias": "self_attn.v_proj.bias"}
_QK_NORM_MAP = {"attention.q_norm.weight": "self_attn.q_norm.weight", "attention.k_norm.weight": "self_attn.k_norm.weight"}


def hf_architecture_for(args: ModelArgs) -> str:
    """The transformers class our fields describe: Qwen3 (q/k norm), Qwen2 (q/k/v biases) or Llama;
    ForCausalLM, or ForSequenceClassification for a scalar head (num_labels 1)."""
    if args.num_labels not in (None, 1):
        raise ConfigError(f"num_labels {args.num_labels}: only 1 (a scalar score head) has a Hugging Face export")
    suffix = "ForSequenceClassification" if args.num_labels else "ForCausalLM"
    if args.qk_norm:
        if args.qkv_bias:  # Qwen3's attention_bias would also add an o_proj bias we do not have
            raise ConfigError("a model with both qk_norm and qkv_bias has no Hugging Face class (Qwen3 without "
                              "q/k/v biases, Qwen2 without q/k norm)")
        return "Qwen3" + suffix
    return ("Qwen2" if args.qkv_bias else "Llama") + suffix


def hf_key_map(args: ModelArgs) -> Dict[str, str]:
    """Our FQN (as in `Transformer.state_dict()`) → HF tensor name, in HF's order.

    With tied embeddings `output.weight` is absent: it is `tok_embeddings.weight`, and HF
    saves only `model.embed_tokens.weight`. A scalar head (num_labels) is HF's `score.weight`."""
    m = {"tok_embeddings.weight": "model.embed_tokens.weight"}
    layer = dict(_LAYER_MAP, **(_BIAS_MAP if args.qkv_bias else {}), **(_QK_NORM_MAP if args.qk_norm else {}))
    for i in range(args.n_layers):
        for ours, hf in layer.items():
            m[f"layers.{i}.{ours}"] = f"model.layers.{i}.{hf}"
    m["norm.weight"] = "model.norm.weight"
    if not args.tie_embeddings:
        m["output.weight"] = "score.weight" if args.num_labels else "lm_head.weight"
    return m


def expected_shapes(args: ModelArgs) -> Dict[str, Tuple[int, ...]]:
    """Our FQN → shape, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = Transformer(dataclasses.replace(args, max_seq_len=1))  # sizes do not depend on it
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def read_hf_dims(path: str) -> Dict[str, Any]:
    """ModelArgs fields from `<path>/config.json` (max_seq_len = max_position_embeddings)."""
    try:
        return hf_model_dims(path)
    except HFConfigError as e:
        raise ConfigError(str(e)) from None


# ---------------------------------------------------------------------------------- checks

def _safetensors_header(path: str) -> Dict[str, Any]:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 * 2**20:
                raise ValueError("header length implausible")
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error) as e:
        raise ConfigError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
    header.pop("__metadata__", None)
    end = max((int(e["data_offsets"][1]) for e in header.values() if isinstance(e, dict) and "data_offsets" in e), default=0)
    size = os.path.getsize(path)
    if size != 8 + n + end:  # e.g. an interrupted download
        raise ConfigError(f"{path}: {size} bytes, its header describes {8 + n + end} (truncated or corrupt)")
    return header


def hf_weight_files(path: str) -> Dict[str, str]:
    """HF tensor name → the safetensors file (full path) holding it."""
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{index}: not a readable index ({type(e).__name__}: {e})") from None
        out = {}
        for name, fname in weight_map.items():
            fp = os.path.join(path, fname)
            if not os.path.isfile(fp):
                raise ConfigError(f"{index}: {name} is in {fname}, which does not exist")
            out[name] = fp
        return out
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ConfigError(f"{path}: no *.safetensors weights")
    out = {}
    for fname in files:
        for name in _safetensors_header(os.path.join(path, fname)):
            out[name] = os.path.join(path, fname)
    return out


def check_hf_dir(path: str, args: ModelArgs) -> Dict[str, str]:
    """Check an HF directory against `args` from its headers alone: every expected tensor is
    present with the expected shape and a float dtype, nothing unknown is left over.
    Returns HF name → file. Raises ConfigError with one line naming the tensor or key."""
    files = hf_weight_files(path)
    headers: Dict[str, Dict[str, Any]] = {}
    for fp in sorted(set(files.values())):
        headers[fp] = _safetensors_header(fp)
    shapes = expected_shapes(args)
    key_map = hf_key_map(args)
    for ours, hf in key_map.items():
        if hf not in files:
            raise ConfigError(f"{path}: missing tensor {hf} (our {ours}; config.json implies it)")
        fp = files[hf]
        entry = headers[fp].get(hf)
        if entry is None:
            raise ConfigError(f"{fp}: missing tensor {hf} (listed in {INDEX})")
        shape, want = tuple(entry.get("shape", ())), shapes[ours]
        if shape != want:
            raise ConfigError(f"{fp}: tensor {hf} has shape {list(shape)}, config.json implies {list(want)}")
        if entry.get("dtype") not in _SAFETENSORS_DTYPES:
            raise ConfigError(f"{fp}: tensor {hf} has dtype {entry.get('dtype')} (supported: {', '.join(_SAFETENSORS_DTYPES)})")
    known = set(key_map.values())
    for hf, fp in sorted(files.items()):
        if hf in known or hf.endswith(_IGNORABLE_SUFFIXES):
            continue
        if hf == "lm_head.weight" and args.tie_embeddings:
            continue  # some tied checkpoints also store the (identical) output matrix
        family = "Qwen3" if args.qk_norm else "Qwen2" if args.qkv_bias else "Llama"
        kind = "scalar-head" if args.num_labels else "tied" if args.tie_embeddings else "untied"
        raise ConfigError(f"{fp}: unexpected tensor {hf} (not part of a {kind} {family} model with these sizes)")
    return {hf: files[hf] for hf in key_map.values()}


# ------------------------------------------------------------------------------------- in

def load_hf_state_dict(path: str, args: ModelArgs, device: str | torch.device = "cpu",
                       dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
    """Our FQN → tensor, read from the safetensors files (checked first). Tied: no output.weight."""
    from safetensors import safe_open

    files = check_hf_dir(path, args)
    key_map = hf_key_map(args)
    by_file: Dict[str, List[Tuple[str, str]]] = {}
    for ours, hf in key_map.items():
        by_file.setdefault(files[hf], []).append((ours, hf))
    out = {}
    for fp, items in by_file.items():
        with safe_open(fp, framework="pt", device=str(device)) as f:
            for ours, hf in items:
                t = f.get_tensor(hf)
                out[ours] = t.to(dtype) if dtype is not None else t
    return out


def load_state_into(model: Transformer, state: Dict[str, torch.Tensor]) -> None:
    """Copy our-FQN tensors into `model` (exactly the parameters of hf_key_map; a tied
    output follows tok_embeddings)."""
    with torch.no_grad():
        for name, t in state.items():
            model.get_parameter(name).copy_(t)


def lora_info(step_dir: str) -> Optional[Dict[str, Any]]:
    """The `lora` record of one of our checkpoints (base path or `seed:N`, base hash, rank,
    alpha, targets), or None for a full checkpoint. A LoRA checkpoint holds adapters only."""
    path = os.path.join(step_dir, "train_state.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f).get("lora") or None


def _seeded_state(args: ModelArgs, seed: int) -> Dict[str, torch.Tensor]:
    """The base a LoRA run drew from `run.seed` (Transformer.init_weights, same draws)."""
    model = Transformer(args)
    model.init_weights(seed=seed)
    state = {k: v for k, v in model.state_dict().items()}
    if args.tie_embeddings:
        state.pop("output.weight", None)
    return state


def base_state(base: str, args: ModelArgs) -> Dict[str, torch.Tensor]:
    """Full weights of a LoRA record's `base`: an HF directory, one of our checkpoints (itself
    possibly LoRA: merged), or `seed:N`."""
    if base.startswith("seed:"):
        return _seeded_state(args, int(base[len("seed:"):]))
    if os.path.isfile(os.path.join(base, "train_state.json")):
        return checkpoint_state(base, args)
    return load_hf_state_dict(base, args)


def checkpoint_state(step_dir: str, args: ModelArgs, merge_lora: bool = True) -> Dict[str, torch.Tensor]:
    """Our FQN → full tensor for one of our checkpoints. A LoRA checkpoint is merged into its
    base (`merge_lora`), or returned as base + adapter tensors (`merge_lora=False`)."""
    from elastic.model.dcp_io import read_model_state

    info = lora_info(step_dir)
    state = read_model_state(step_dir, adapters_only=info is not None)
    if info is not None:
        from elastic.model.lora import LoRAConfig, merge_state

        base = base_state(info["base"], args)
        if info.get("quantize_base") == "nf4":  # QLoRA: the adapters belong to the base's NF4 round trip
            from elastic.model.quantize import block_weight_names, roundtrip_state

            base = roundtrip_state(base, block_weight_names(base))
        state = merge_state(base, state, LoRAConfig.from_section(info).scaling) if merge_lora else {**base, **state}
    if args.tie_embeddings:
        state.pop("output.weight", None)
    return state


def from_pretrained(path: str, device: str | torch.device = "cpu", dtype: Optional[torch.dtype] = None,
                    attention_backend: str = "sdpa_mask", merge_lora: bool = True) -> Transformer:
    """A Transformer with the weights of an HF directory or of one of our `step_N` checkpoints.

    A LoRA checkpoint gives its base with the adapters merged in, or (`merge_lora=False`) the
    base with the adapters as LoRALinear layers (elastic/model/lora.py). Built on the meta
    device and materialised once, so no random init is paid for."""
    lora = None
    if os.path.isfile(os.path.join(path, "train_state.json")):
        from elastic.config.init_from import resolve_init_from

        args = ModelArgs(**resolve_init_from(path, key="checkpoint").dims)
        state = checkpoint_state(path, args, merge_lora)
        info = lora_info(path)
        if info is not None and not merge_lora:
            from elastic.model.lora import LoRAConfig

            lora = LoRAConfig.from_section(info)
        from elastic.model.lora import is_adapter_key

        _check_state({k: v for k, v in state.items() if not is_adapter_key(k)}, args, path)
    else:
        args = ModelArgs(**read_hf_dims(path))
        state = load_hf_state_dict(path, args)
    with torch.device("meta"):
        model = Transformer(args, attention_backend=attention_backend)
        if lora is not None:
            from elastic.model.lora import apply_lora

            apply_lora(model, lora)
    model.to_empty(device=device)
    model.tie_weights()
    load_state_into(model, state)
    return model.to(dtype) if dtype is not None else model


def _check_state(state: Dict[str, torch.Tensor], args: ModelArgs, where: str) -> None:
    shapes = expected_shapes(args)
    for name in hf_key_map(args):
        if name not in state:
            raise ConfigError(f"{where}: missing tensor {name}")
        if tuple(state[name].shape) != shapes[name]:
            raise ConfigError(f"{where}: tensor {name} has shape {list(state[name].shape)}, the run's config implies {list(shapes[name])}")


def check_init_from(cfg) -> None:
    """Driver-side check of `model.init_from` before any worker starts: the source's tensors
    (HF safetensors headers, or our checkpoint's DCP .metadata) match the resolved sizes.
    Reads no tensor data. ConfigError with one line naming the tensor otherwise."""
    from elastic.config import resolved_model_dims
    from elastic.config.init_from import resolve_init_from

    src = resolve_init_from(cfg.model.init_from)
    dims = resolved_model_dims(cfg)
    if dims.get("num_labels") and not src.dims.get("num_labels"):
        # A new score head on a causal LM's backbone: the source is checked as the causal LM it is
        # (its vocabulary projection is there, just not used), the backbone's sizes are the same.
        dims = {**dims, "tie_embeddings": src.dims["tie_embeddings"]}
        dims.pop("num_labels")
    args = ModelArgs(**dims)
    if getattr(cfg.model, "quantize_base", "none") != "none" and src.kind != "hf" and lora_info(src.path) is not None:
        raise ConfigError(f"model.quantize_base: {cfg.model.quantize_base} quantizes a full base; {cfg.model.init_from} "
                          "holds LoRA adapters (export it merged with jobs/export_hf.py --merge-lora first)")
    if src.kind == "hf":
        try:
            check_hf_dir(src.path, args)
        except ConfigError as e:
            raise ConfigError(f"model.init_from: {e}") from None
        return
    _check_checkpoint(src.path, src.config_path, args)


def _check_checkpoint(path: str, config_path: str, args: ModelArgs) -> None:
    """Our checkpoint's tensors against `args`, from `.metadata` alone. A LoRA checkpoint:
    its adapters here, its base where the record points (recursively)."""
    from elastic.model.dcp_io import model_tensor_specs
    from elastic.model.lora import adapter_pairs, is_adapter_key

    specs = model_tensor_specs(path)
    shapes = expected_shapes(args)
    info = lora_info(path)
    if info is not None:
        base = info.get("base", "")
        if not base.startswith("seed:"):
            if not os.path.isdir(base):
                raise ConfigError(f"model.init_from: {path} holds LoRA adapters for the base {base}, which does not exist")
            if os.path.isfile(os.path.join(base, "train_state.json")):
                _check_checkpoint(base, config_path, args)
            else:
                try:
                    check_hf_dir(base, args)
                except ConfigError as e:
                    raise ConfigError(f"model.init_from: {path}: its LoRA base: {e}") from None
        fake = {k: torch.empty(0) for k in specs if is_adapter_key(k)}
        try:
            pairs = adapter_pairs(fake)
        except ValueError as e:
            raise ConfigError(f"model.init_from: {path}: {e}") from None
        for wname in pairs:
            if wname not in shapes:
                raise ConfigError(f"model.init_from: {path}: adapter for {wname}, which the model does not have")
        return
    for name, want in shapes.items():
        if name not in specs:
            raise ConfigError(f"model.init_from: {path}: missing tensor model.{name}")
        if specs[name][0] != want:
            raise ConfigError(f"model.init_from: {path}: tensor model.{name} has shape {list(specs[name][0])}, "
                              f"{config_path} implies {list(want)}")


# ------------------------------------------------------------------------------------ out

def hf_config_dict(args: ModelArgs, dtype: torch.dtype, eos_id: Optional[int], pad_id: Optional[int],
                   bos_id: Optional[int] = None) -> Dict[str, Any]:
    """config.json for our sizes: Qwen3 with q/k norm, Qwen2 with q/k/v biases, else Llama.
    Written in the form transformers 4.x reads (rope_theta, rope_scaling) and 5.x reads
    (rope_parameters; it also reads rope_scaling, which then says the same). A scalar head:
    *ForSequenceClassification with num_labels 1, id2label {"0": "LABEL_0"} and label2id as
    transformers writes them, and `pad_id` required (transformers finds each row's last
    non-pad token with it, and refuses batches of more than one row without it)."""
    arch = hf_architecture_for(args)
    if args.num_labels and pad_id is None:
        raise ConfigError(f"{arch} needs a pad_token_id (transformers scores each row at its last non-pad token); "
                          "the tokenizer has no pad token and no EOS to pad with")
    model_type = {"Llama": "llama", "Qwen2": "qwen2", "Qwen3": "qwen3"}[arch[:arch.index("For")]]
    scaling = dict(args.rope_scaling) if args.rope_scaling else None
    rope_parameters = {"rope_type": "default", "rope_theta": args.rope_theta} if scaling is None else \
        {**scaling, "rope_theta": args.rope_theta}
    cfg: Dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": args.vocab_size, "hidden_size": args.dim, "intermediate_size": args.ffn_hidden,
        "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads, "hidden_act": "silu",
        "max_position_embeddings": args.max_seq_len, "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta, "rope_parameters": rope_parameters,
        "tie_word_embeddings": args.tie_embeddings, "attention_dropout": 0.0, "initializer_range": 0.02,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        "torch_dtype": str(dtype).replace("torch.", ""), "use_cache": True,
    }
    if scaling is not None:
        cfg["rope_scaling"] = scaling  # 4.x: the scaling without theta (which is top-level there)
    if args.num_labels:
        # transformers derives num_labels from id2label (and writes only the maps); 4.x and 5.x
        # both accept an agreeing num_labels beside them.
        labels = {str(i): f"LABEL_{i}" for i in range(args.num_labels)}
        cfg.update(num_labels=args.num_labels, id2label=labels, label2id={v: int(k) for k, v in labels.items()})
    if model_type == "llama":
        cfg.update(head_dim=args.head_dim, attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:
        cfg.update(use_sliding_window=False, sliding_window=None, max_window_layers=args.n_layers)
        if model_type == "qwen3":
            cfg.update(head_dim=args.head_dim, attention_bias=False)
        elif args.head_dim != args.dim // args.n_heads or args.dim % args.n_heads:
            cfg["head_dim"] = args.head_dim  # Qwen2 reads it when present (hidden / heads otherwise)
    return cfg


def plan_shards(sizes: Dict[str, int], max_shard_bytes: int) -> List[List[str]]:
    """Consecutive groups of tensor names, each at most `max_shard_bytes` (a single larger
    tensor gets a shard of its own)."""
    shards: List[List[str]] = [[]]
    used = 0
    for name, n in sizes.items():
        if shards[-1] and used + n > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += n
    return shards


def save_hf_weights(state: Dict[str, torch.Tensor], args: ModelArgs, out_dir: str, dtype: Optional[torch.dtype] = None,
                    max_shard_bytes: int = MAX_SHARD_BYTES) -> List[str]:
    """Write our state dict as HF-named safetensors; returns the files written."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    _check_state(state, args, "state dict")
    tensors = {}
    for ours, hf in hf_key_map(args).items():
        t = state[ours].detach().to("cpu")
        tensors[hf] = (t.to(dtype) if dtype is not None else t).contiguous()
    sizes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    shards = plan_shards(sizes, max_shard_bytes)
    if len(shards) == 1:
        save_file(tensors, os.path.join(out_dir, SINGLE), metadata={"format": "pt"})
        return [SINGLE]
    names, weight_map = [], {}
    for i, group in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: tensors[k] for k in group}, os.path.join(out_dir, fname), metadata={"format": "pt"})
        names.append(fname)
        weight_map.update({k: fname for k in group})
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": dict(sorted(weight_map.items()))}
    _write_json(os.path.join(out_dir, INDEX), index)
    return names + [INDEX]


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


# Our byte-level BPE's specials (elastic/data/tokenizer.py); HF tokenizers use their own.
EOS, PAD = "<|endoftext|>", "<|pad|>"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_tokenizer(tokenizer_json: str, out_dir: str, model_max_length: int) -> Dict[str, Optional[int]]:
    """Tokenizer files AutoTokenizer accepts; returns eos/pad/bos ids for the configs.

    A tokenizer that came from an HF directory keeps that directory's tokenizer_config.json
    (chat template, special tokens); our own BPE gets a PreTrainedTokenizerFast config with
    `<|endoftext|>` as EOS and `<|pad|>` as padding."""
    from tokenizers import Tokenizer

    src_dir = os.path.dirname(os.path.abspath(tokenizer_json))
    shutil.copyfile(tokenizer_json, os.path.join(out_dir, "tokenizer.json"))
    tok = Tokenizer.from_file(tokenizer_json)
    src_cfg = os.path.join(src_dir, "tokenizer_config.json")
    if os.path.isfile(src_cfg):
        for name in _TOKENIZER_FILES[1:]:
            if os.path.isfile(os.path.join(src_dir, name)):
                shutil.copyfile(os.path.join(src_dir, name), os.path.join(out_dir, name))
        with open(src_cfg) as f:
            tc = json.load(f)

        def tid(key: str) -> Optional[int]:
            v = tc.get(key)
            v = v.get("content") if isinstance(v, dict) else v
            return tok.token_to_id(v) if isinstance(v, str) else None

        return {"eos": tid("eos_token"), "pad": tid("pad_token"), "bos": tid("bos_token")}
    eos, pad = tok.token_to_id(EOS), tok.token_to_id(PAD)
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
          "clean_up_tokenization_spaces": False, "bos_token": None,
          "eos_token": EOS if eos is not None else None, "pad_token": PAD if pad is not None else (EOS if eos is not None else None)}
    _write_json(os.path.join(out_dir, "tokenizer_config.json"), tc)
    _write_json(os.path.join(out_dir, "special_tokens_map.json"), {k: v for k, v in tc.items() if k.endswith("_token") and v})
    return {"eos": eos, "pad": pad if pad is not None else eos, "bos": None}


def save_hf(state: Dict[str, torch.Tensor], args: ModelArgs, out_dir: str, tokenizer_json: str,
            dtype: Optional[torch.dtype] = None, max_shard_bytes: int = MAX_SHARD_BYTES) -> List[str]:
    """A complete HF directory: weights, config.json, generation_config.json, tokenizer.

    A scalar-head model (reward model, critic) is a *ForSequenceClassification directory and has
    no generation_config.json; its pad_token_id is the tokenizer's pad token, else its EOS (as
    training pads: elastic/data/tokenizer.py)."""
    hf_architecture_for(args)  # a model with no HF class fails before anything is written
    os.makedirs(out_dir, exist_ok=True)
    files = save_hf_weights(state, args, out_dir, dtype, max_shard_bytes)
    ids = write_tokenizer(tokenizer_json, out_dir, args.max_seq_len)
    dt = dtype or next(iter(state.values())).dtype
    if args.num_labels:
        pad = ids["pad"] if ids["pad"] is not None else ids["eos"]
        _write_json(os.path.join(out_dir, "config.json"), hf_config_dict(args, dt, ids["eos"], pad, ids["bos"]))
        return files + ["config.json"] + [f for f in _TOKENIZER_FILES if os.path.isfile(os.path.join(out_dir, f))]
    _write_json(os.path.join(out_dir, "config.json"), hf_config_dict(args, dt, ids["eos"], ids["pad"], ids["bos"]))
    gen = {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"]}
    src_gen = os.path.join(os.path.dirname(os.path.abspath(tokenizer_json)), "generation_config.json")
    if os.path.isfile(src_gen):  # an HF source's own sampling defaults and stop ids
        with open(src_gen) as f:
            gen = {**json.load(f), **{k: v for k, v in gen.items() if v is not None}}
        gen.pop("transformers_version", None)
    _write_json(os.path.join(out_dir, "generation_config.json"), gen)
    return files + ["config.json", "generation_config.json"] + [f for f in _TOKENIZER_FILES if os.path.isfile(os.path.join(out_dir, f))]


def _our_checkpoint(step_dir: str, key: str):
    from elastic.config.init_from import resolve_init_from

    if not os.path.isdir(step_dir):
        raise ConfigError(f"{key}: {step_dir}: no such directory")
    if not os.path.isfile(os.path.join(step_dir, "train_state.json")):
        raise ConfigError(f"{key}: {step_dir}: not one of our checkpoints (no train_state.json)")
    return resolve_init_from(step_dir, key=key)


def export_checkpoint(step_dir: str, out_dir: str, dtype: Optional[torch.dtype] = None,
                      max_shard_bytes: int = MAX_SHARD_BYTES, key: str = "--checkpoint",
                      merge_lora: bool = False) -> List[str]:
    """One of our DCP checkpoints (`<run>/step_N`) → an HF directory. Read in one process,
    without a process group; the bytes written do not depend on the world size that saved it.
    A LoRA checkpoint (adapters only) needs `merge_lora`: its base with W + (alpha/r)·B·A.
    Errors are one-line ConfigErrors starting with `key`."""
    src = _our_checkpoint(step_dir, key)
    args = ModelArgs(**src.dims)
    info = lora_info(step_dir)
    if info is not None and not merge_lora:
        raise ConfigError(f"{key}: {step_dir} holds LoRA adapters only (base {info.get('base')}): pass --merge-lora "
                          "for a full model, or --peft for a PEFT adapter directory")
    if info is not None and not info.get("base", "").startswith("seed:") and not os.path.exists(info["base"]):
        raise ConfigError(f"{key}: {step_dir}: its LoRA base {info['base']} does not exist")
    state = checkpoint_state(step_dir, args, merge_lora=True)
    return save_hf(state, args, out_dir, src.tokenizer, dtype, max_shard_bytes)


PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


def export_peft(step_dir: str, out_dir: str, dtype: Optional[torch.dtype] = None, key: str = "--checkpoint") -> List[str]:
    """A LoRA checkpoint → a PEFT adapter directory (`adapter_config.json`,
    `adapter_model.safetensors`) that `peft.PeftModel.from_pretrained(base, out_dir)` loads on
    the Hugging Face form of the base (the base directory itself when it is one; else export it
    with jobs/export_hf.py). `base_model_name_or_path` records the base as trained."""
    from safetensors.torch import save_file

    from elastic.model.dcp_io import read_model_state
    from elastic.model.lora import LoRAConfig, peft_config, peft_state

    _our_checkpoint(step_dir, key)
    info = lora_info(step_dir)
    if info is None:
        raise ConfigError(f"{key}: {step_dir} is a full checkpoint, not LoRA adapters (export it without --peft)")
    tensors = peft_state(read_model_state(step_dir, adapters_only=True))
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, PEFT_WEIGHTS), metadata={"format": "pt"})
    _write_json(os.path.join(out_dir, PEFT_CONFIG), peft_config(LoRAConfig.from_section(info), info["base"]))
    return [PEFT_WEIGHTS, PEFT_CONFIG]


def parse_size(text: str) -> int:
    """'5GB', '500MB', '123' → bytes (decimal units, as HF's max_shard_size)."""
    t = text.strip().upper()
    for unit, mult in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("B", 1)):
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * mult)
    return int(t)
