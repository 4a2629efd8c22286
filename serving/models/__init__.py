"""Target models: HF Llama/Qwen3 checkpoints as `CausalLM` (interface: docs/contracts.md section 3)."""

from serving.models.config import ModelConfig, ModelError, read_model_config
from serving.models.kv_cache import KVCache
from serving.models.llama import CausalLM
from serving.models.loader import Checkpoint, inspect_checkpoint, load_model

__all__ = ["CausalLM", "Checkpoint", "KVCache", "ModelConfig", "ModelError",
           "inspect_checkpoint", "load_model", "read_model_config"]
