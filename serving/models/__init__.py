"""Target models: HF Llama/Qwen3 checkpoints as `CausalLM`, Qwen3.5/3.6 hybrids as `HybridLM`
(interface: docs/contracts.md section 3)."""

from serving.models.config import ModelConfig, ModelError, read_model_config
from serving.models.kv_cache import KVCache
from serving.models.hybrid_cache import HybridCache
from serving.models.llama import CausalLM
from serving.models.loader import Checkpoint, inspect_checkpoint, load_model
from serving.models.qwen3_5 import HybridLM

__all__ = ["CausalLM", "Checkpoint", "HybridCache", "HybridLM", "KVCache", "ModelConfig", "ModelError",
           "inspect_checkpoint", "load_model", "read_model_config"]
