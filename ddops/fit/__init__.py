"""Memory-fit planner: will a profile's model, draft and pools fit the GPUs, before launch?

Public API:
  GPU_KINDS, find_gpu(kind), gpu_from_gib(n)           known cards and their memory
  facts_from_config(config, path), read_model(files, path) -> ModelFacts
  Setup, plan(setup, target, draft) -> Pools            per-GPU arithmetic (pure)
  assess(setup, target, draft) -> Assessment            pools + Verdict (fits, reasons, suggestions)
  fit_profile(profile, gpu, models), read_models(profile, reader), local_reader(), remote_reader()
  bundled.bundled_fit(...)                              what the bundled runtime will allocate
  memory_models.predict(profile, card, models) -> Prediction   by the runtime's memory model: fits?
"""

from ddops.fit.gpus import GPU_KINDS, GpuKind, find_gpu, gpu_from_gib
from ddops.fit.memory import Pools, Setup, plan
from ddops.fit.model import ModelFacts, ModelFactsError, facts_from_config
from ddops.fit.profile_fit import (Models, fit_profile, host_gpu, local_reader, needs_gpu, read_models,
                                   remote_reader, setup_for)
from ddops.fit.verdict import Assessment, Verdict, assess

__all__ = [
    "GPU_KINDS", "Assessment", "GpuKind", "ModelFacts", "ModelFactsError", "Models", "Pools", "Setup",
    "Verdict", "assess", "facts_from_config", "find_gpu", "fit_profile", "gpu_from_gib", "host_gpu",
    "local_reader", "needs_gpu", "plan", "read_models", "remote_reader", "setup_for",
]
