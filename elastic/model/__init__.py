"""Plain-PyTorch Llama-style model: no Ray, no torch.distributed."""

from elastic.model.attention import BACKENDS, available_backends, build_attention_metadata, choose_backend
from elastic.model.llama import ModelArgs, Transformer, flops_per_token

__all__ = ["BACKENDS", "ModelArgs", "Transformer", "available_backends", "build_attention_metadata", "choose_backend", "flops_per_token"]
