"""The runtimes a profile can target, each with its table of profile key -> launch flag.

The flag tables are data: render walks them to build a unit's command line, and the rules
walk them to reject a setting the chosen runtime has no flag for (e.g. mamba settings on the
bundled runtime). Flag names are SGLang's 0.5.15 spellings, plus DDTree's PR #29907 flags, and
are what a profile without `sglang_version` renders; a declared version re-spells them through
`sglang_versions.spell`. The bundled runtime accepts the subset in docs/contracts.md section 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Style = Literal["value", "switch", "off_switch", "method"]


@dataclass(frozen=True)
class Flag:
    key: str  # dotted profile key, e.g. "memory.context_length"
    flag: str
    # value: `--flag VALUE` when set; switch: `--flag` when true; off_switch: `--flag` when
    # false; method: `--flag NAME` with the method's SGLang spelling, omitted for plain decoding.
    style: Style = "value"


@dataclass(frozen=True)
class Runtime:
    module: str  # run as `<python> -m <module>`
    template: str  # unit template under templates/
    flags: tuple[Flag, ...]
    # How the API key reaches the process without being in argv: "env" = the runtime reads
    # DDOPS_API_KEY (bundled); "config_file" = SGLang, which takes it only as --api-key or as
    # `api-key:` in its --config YAML, turned into arguments inside the process.
    api_key_via: Literal["env", "config_file"]
    needs_gpu: bool
    # Flag spellings change between releases, so a profile may pin the version it targets.
    versioned_flags: bool
    # How the runtime sizes GPU memory (ddops.fit): "pools" = SGLang's static fraction, KV pool
    # and hybrid-state pools; "exact" = every tensor preallocated for one sequence.
    memory_model: Literal["pools", "exact"] = "pools"

    def flag_for(self, key: str) -> Flag | None:
        return next((f for f in self.flags if f.key == key), None)


_SERVE = (
    Flag("model.path", "--model-path"),
    Flag("model.served_name", "--served-model-name"),
    Flag("service.host", "--host"),
    Flag("service.port", "--port"),
)
_SPECULATIVE = (
    Flag("speculative.algorithm", "--speculative-algorithm", "method"),
    Flag("speculative.draft_model_path", "--speculative-draft-model-path"),
    Flag("speculative.block_size", "--speculative-num-draft-tokens"),
    Flag("speculative.ddtree_budget", "--speculative-ddtree-budget"),
)

SGLANG = Runtime(
    module="sglang.launch_server",
    template="sglang.service.j2",
    flags=_SERVE + (
        Flag("model.tp_size", "--tp-size"),
        Flag("model.dtype", "--dtype"),
        Flag("model.trust_remote_code", "--trust-remote-code", "switch"),
        Flag("memory.mem_fraction_static", "--mem-fraction-static"),
        Flag("memory.context_length", "--context-length"),
        Flag("memory.max_running_requests", "--max-running-requests"),
        Flag("memory.chunked_prefill_size", "--chunked-prefill-size"),
        Flag("memory.kv_cache_dtype", "--kv-cache-dtype"),
        Flag("cuda_graph.enabled", "--disable-cuda-graph", "off_switch"),
        Flag("cuda_graph.max_bs", "--cuda-graph-max-bs"),
        Flag("mamba.max_mamba_cache_size", "--max-mamba-cache-size"),
        Flag("mamba.ssm_dtype", "--mamba-ssm-dtype"),
        Flag("mamba.full_memory_ratio", "--mamba-full-memory-ratio"),
        Flag("mamba.scheduler_strategy", "--mamba-scheduler-strategy"),
    ) + _SPECULATIVE + (
        Flag("service.enable_metrics", "--enable-metrics", "switch"),
        Flag("service.log_level", "--log-level"),
    ),
    api_key_via="config_file",
    needs_gpu=True,
    versioned_flags=True,
)

BUNDLED = Runtime(
    module="serving",
    template="bundled.service.j2",
    flags=_SERVE + (
        Flag("model.dtype", "--dtype"),
        Flag("service.device", "--device"),
        Flag("memory.mem_fraction_static", "--mem-fraction-static"),
        Flag("memory.context_length", "--context-length"),
        Flag("memory.max_running_requests", "--max-running-requests"),
        Flag("cuda_graph.enabled", "--disable-cuda-graph", "off_switch"),
        Flag("cuda_graph.max_bs", "--cuda-graph-max-bs"),
    ) + _SPECULATIVE + (
        Flag("service.log_level", "--log-level"),
    ),
    api_key_via="env",
    needs_gpu=False,
    versioned_flags=False,
    memory_model="exact",
)

RUNTIMES: dict[str, Runtime] = {"sglang": SGLANG, "bundled": BUNDLED}

# Keys some runtime turns into a flag; a non-default value of one of these must have a flag
# in the chosen runtime, or the profile asks for something that would silently not happen.
RUNTIME_KEYS: frozenset[str] = frozenset(f.key for r in RUNTIMES.values() for f in r.flags)
