"""Export one of our checkpoints as a Hugging Face model directory:
`python jobs/export_hf.py --checkpoint <run>/step_N --out <dir> [--dtype bf16] [--max-shard-size 5GB] [--merge-lora | --peft]`.

The result loads with `transformers.AutoModelForCausalLM.from_pretrained(<dir>)` (Llama, with
Llama 3.1's `rope_scaling` when it has one; Qwen2 when the model has q/k/v biases; Qwen3 when
it has q/k norms) and `AutoTokenizer.from_pretrained(<dir>)`. Runs in
one process with no Ray and no process group; the checkpoint may come from any world size.
A LoRA checkpoint (adapters only) exports either merged into its base (`--merge-lora`: a full
model, as above) or as a PEFT adapter directory (`--peft`: `adapter_config.json` and
`adapter_model.safetensors`, for `peft.PeftModel.from_pretrained(base_model, <dir>)`).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic.config import ConfigError  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a checkpoint directory <run>/step_NNNNNNNN")
    ap.add_argument("--out", required=True, help="output directory (created; existing files are overwritten)")
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16", "checkpoint"), default="checkpoint",
                    help="dtype of the exported weights (default: the checkpoint's own, fp32)")
    ap.add_argument("--max-shard-size", default="5GB", help="split weights into shards of at most this size (default 5GB)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--merge-lora", action="store_true",
                      help="LoRA checkpoint: merge the adapters into the base, W + (alpha/r)·B·A, and export the full model")
    mode.add_argument("--peft", action="store_true", help="LoRA checkpoint: write a PEFT adapter directory instead")
    args = ap.parse_args(argv)

    import torch

    from elastic.model.hf import export_checkpoint, export_peft, parse_size

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "checkpoint": None}[args.dtype]
    try:
        if args.peft:
            files = export_peft(args.checkpoint, args.out, dtype=dtype)
        else:
            files = export_checkpoint(args.checkpoint, args.out, dtype=dtype, max_shard_bytes=parse_size(args.max_shard_size),
                                      merge_lora=args.merge_lora)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # --max-shard-size
        print(f"error: --max-shard-size {args.max_shard_size}: {e}", file=sys.stderr)
        return 2
    print(f"[elastic] exported {args.checkpoint} -> {args.out}: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
