"""Plain-PyTorch Llama-style model: no Ray, no torch.distributed.

llama.py (the model), attention.py (document-masked backends), generate.py (the generation
engine: decoder.py, static_cache.py, sampling.py, cuda_graphs.py; generate_reference.py and
kv_cache.py are the pre-engine path, kept as its reference), hf.py (Hugging Face Llama/Qwen2/Qwen3
in and out), dcp_io.py (reading our checkpoints in one process, for tools).
"""

from elastic.model.attention import BACKENDS, available_backends, build_attention_metadata, choose_backend
from elastic.model.generate import Completion, generate
from elastic.model.llama import ModelArgs, Transformer, flops_per_token

__all__ = ["BACKENDS", "Completion", "ModelArgs", "Transformer", "available_backends", "build_attention_metadata", "choose_backend",
           "flops_per_token", "generate"]
