"""Hugging Face weights into an FSDP2-sharded model, each rank reading only its shards.

torch.distributed.checkpoint's `HuggingFaceStorageReader` reads a plain `save_pretrained`
directory (one or several safetensors files): we hand it this rank's sharded parameters under
their Hugging Face names (elastic/model/hf.py's key map) and it fills in the slices this rank
holds, converting dtypes by copy. No rank ever materialises the whole model. The driver has
already checked names and shapes from the safetensors headers (`check_init_from`), so a
failure here is an I/O problem; DCP raises `CheckpointException` (a BaseException), which is
turned into one line naming the directory.
"""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from elastic.model.hf import hf_key_map


def load_hf_weights(model: torch.nn.Module, hf_dir: str, skip: tuple = ()) -> None:
    """`skip`: our tensor names not read (a new scalar head on a causal LM's backbone)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    from elastic.model.quantize import is_nf4

    # QLoRA's NF4 weights (whole on every rank) are read whole and quantized by copy_.
    nf4 = {n.replace("_checkpoint_wrapped_module.", ""): p for n, p in model.named_parameters() if is_nf4(p)}
    ours = get_model_state_dict(model)
    keymap = {k: v for k, v in hf_key_map(model.args).items() if k not in skip and k not in nf4}
    if nf4:
        _load_whole(nf4, hf_key_map(model.args), hf_dir)
    by_hf = {hf: ours[name] for name, hf in keymap.items() if name in ours}
    try:
        dcp.load(by_hf, storage_reader=HuggingFaceStorageReader(hf_dir))
    except Exception as e:
        raise RuntimeError(f"model.init_from {hf_dir}: cannot read the weights ({str(e).strip().splitlines()[0][:300]})") from None
    except BaseException as e:  # DCP's CheckpointException derives from BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise RuntimeError(f"model.init_from {hf_dir}: cannot read the weights ({str(e).strip().splitlines()[0][:300]})") from None
    loaded = {name: by_hf[hf] for name, hf in keymap.items() if name in ours}
    set_model_state_dict(model, loaded, options=StateDictOptions(strict=False))


@torch.no_grad()
def _load_whole(params: dict, keymap: dict, hf_dir: str) -> None:
    """Our name → parameter, each read whole from the safetensors files (one tensor at a time)."""
    from safetensors import safe_open

    from elastic.model.hf import hf_weight_files

    files = hf_weight_files(hf_dir)
    for name, p in params.items():
        hf = keymap[name]
        with safe_open(files[hf], framework="pt", device="cpu") as f:
            p.copy_(f.get_tensor(hf).to(p.dtype).to(p.device))
