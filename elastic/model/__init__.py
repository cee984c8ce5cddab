"""Plain-PyTorch Llama-style model: no Ray, no torch.distributed, no generation loop.

llama.py (the model), attention.py (document-masked backends), cache.py (what the model asks of a
KV cache: caches themselves live in elastic/generation), lora.py (adapters), quantize.py (QLoRA's
NF4 base, torchao), scores.py (scalar-head
sequence scores), hf.py (Hugging Face Llama/Qwen2/Qwen3 in and out), dcp_io.py (reading our
checkpoints in one process, for tools).
"""

from elastic.model.attention import BACKENDS, available_backends, build_attention_metadata, choose_backend
from elastic.model.llama import ModelArgs, Transformer, flops_per_token

__all__ = ["BACKENDS", "ModelArgs", "Transformer", "available_backends", "build_attention_metadata", "choose_backend",
           "flops_per_token"]
