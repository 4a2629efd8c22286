"""Per-GPU memory arithmetic of a vLLM launch, as vLLM 0.32 sizes its KV cache. Pure.

vLLM (v1/worker/gpu_worker.py `determine_available_memory`, v1/worker/utils.py
`request_memory`) asks for `ceil(total x gpu_memory_utilization)` of each card, loads the
weights, runs one dummy forward of `max_num_batched_tokens` tokens, and keeps for the KV cache

    available = requested - weights - non-torch memory - activation peak - CUDA graph estimate

The cache is cut into blocks of `block_size` tokens (16 on GPU, 128 on CPU; a hybrid's
attention block grows until its page holds one linear-attention state:
platforms/interface.py `_align_hybrid_block_size`). Every layer's page has one size; layers are
grouped by kind (v1/core/kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`) and
`num_blocks = available // (group_size x page)`. vLLM refuses to start when one request of
`max_model_len` tokens needs more than `available` less the null block
(`check_enough_kv_cache_memory`). On CPU the cache is VLLM_CPU_KVCACHE_SPACE GiB, nothing
profiled (v1/worker/cpu_worker.py, platforms/cpu.py).

The activation peak, non-torch memory and CUDA graph memory are measured by vLLM at start;
here they are estimates (`estimated` names them). docs/vllm.md gives the formula and sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddops.fit.gpus import GIB, MIB, GpuKind
from ddops.fit.memory import CUDA_CONTEXT
from ddops.fit.model import ModelFacts, dtype_bytes

DEFAULT_UTILIZATION = 0.92  # CacheConfig.gpu_memory_utilization (config/cache.py)
GPU_BLOCK = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
CPU_BLOCK = 128  # platforms/cpu.py, when --block-size is not given
KERNEL_BLOCK = {"cuda": 16, "cpu": 32}  # FlashAttention MultipleOf(16); CPU attention MultipleOf(32)
# vllm serve defaults below 70 GiB (engine/arg_utils.py), CPU: 2048 x world size
DEFAULT_BATCHED_TOKENS = {"cuda": 2048, "cpu": 2048}
DEFAULT_MAX_SEQS = {"cuda": 256, "cpu": 128}
MAX_CAPTURE = 512  # largest default CUDA graph capture size (config/vllm.py _set_cudagraph_sizes)
# Estimates (not vLLM's numbers): what it measures at start and logs.
NON_TORCH = 256 * MIB  # cuBLAS/attention workspaces outside torch's allocator
NCCL = 512 * MIB  # NCCL and custom all-reduce buffers with tp > 1
PER_GRAPH = 2 * MIB  # one more captured graph (vLLM measures the second capture; >= 1 MiB)
ACTIVATION_MARGIN = 1.5  # the largest tensors of one forward, times this for the rest


@dataclass(frozen=True)
class VllmSetup:
    """One launch: the profile's values with vLLM's defaults filled in."""

    device: str  # "cuda" | "cpu"
    gpu: GpuKind | None  # None on CPU
    tp: int
    utilization: float
    utilization_is_default: bool
    max_model_len: int
    max_num_seqs: int
    batched_tokens: int  # --max-num-batched-tokens: the profiled forward
    weights_dtype: str
    kv_dtype: str
    block_size: int | None = None  # --block-size (vllm.extra_args); None: vLLM's default
    speculative_tokens: int = 0  # num_speculative_tokens
    cuda_graphs: bool = True
    max_capture: int | None = None  # --max-cudagraph-capture-size
    prefix_caching: bool = True  # hybrids keep 2 + K state pages per request with it ("align")
    cpu_kv_bytes: int | None = None  # VLLM_CPU_KVCACHE_SPACE x GiB; None: not set


@dataclass(frozen=True)
class Bucket:
    """Layers of one kind, per rank: each keeps `per_request` pages for a max_model_len request."""

    kind: str  # "target attention" | "draft attention" | "linear-attention state"
    layers: int
    page: int  # bytes of one block of one layer, after unification
    block_tokens: int  # tokens one page covers (0: a state page)
    per_request: int  # pages one max_model_len request holds, per layer


@dataclass(frozen=True)
class VllmPlan:
    """Sizes per GPU (or the CPU cache), in bytes unless named otherwise."""

    capacity: int  # card memory, or the CPU cache
    requested: int
    free_at_start: int
    target_weights: int
    draft_weights: int
    non_torch: int  # estimated
    activation: int  # estimated
    cuda_graphs: int  # estimated
    available: int  # the KV cache
    block_size: int
    buckets: tuple[Bucket, ...]
    group_size: int
    bytes_per_block: int
    num_blocks: int
    needed: int  # one max_model_len request, every layer
    blocks_per_request: int
    max_model_len: int
    longest_len: int  # the longest max_model_len `available` holds

    @property
    def weights(self) -> int:
        return self.target_weights + self.draft_weights

    @property
    def one_request_fits(self) -> bool:
        return 0 < self.needed <= self.available - self.bytes_per_block

    @property
    def concurrency(self) -> float:
        """vLLM's "Maximum concurrency for max_model_len tokens per request"."""
        return self.num_blocks / self.blocks_per_request if self.blocks_per_request else 0.0

    @property
    def kv_tokens(self) -> int:
        """vLLM's "KV cache size: N tokens"."""
        return int(self.concurrency * self.max_model_len)


def plan(s: VllmSetup, target: ModelFacts, draft: ModelFacts | None = None) -> VllmPlan:
    target_w = math.ceil(target.weight_bytes(s.weights_dtype) / s.tp)
    draft_w = math.ceil(draft.weight_bytes(s.weights_dtype) / s.tp) if draft else 0
    if s.device == "cpu":
        capacity = requested = free = s.cpu_kv_bytes or 0
        non_torch = activation = graphs = 0
        available = capacity
    else:
        capacity = s.gpu.memory_bytes
        requested, free = math.ceil(capacity * s.utilization), capacity - CUDA_CONTEXT
        non_torch = NON_TORCH + (NCCL if s.tp > 1 else 0)
        activation = activation_bytes(s, target)
        graphs = graph_bytes(s, target) if s.cuda_graphs else 0
        available = requested - target_w - draft_w - non_torch - activation - graphs
    block, buckets = kv_buckets(s, target, draft)
    group = group_size(buckets)
    per_block = group * buckets[0].page if buckets else 0
    blocks = max(0, available // per_block) if per_block else 0
    return VllmPlan(capacity, requested, free, target_w, draft_w, non_torch, activation, graphs, available,
                    block, buckets, group, per_block, blocks, needed_bytes(buckets),
                    sum(math.ceil(b.layers / group) * b.per_request for b in buckets), s.max_model_len,
                    longest_len(s, target, draft, available - per_block))


def attention_token_bytes(m: ModelFacts, s: VllmSetup) -> int:
    """K and V of one token in one layer on one rank: KV heads split by TP (replicated below)."""
    a = m.attention
    return int(max(1, a.kv_heads // s.tp) * (a.head_dim + a.v_head_dim) * dtype_bytes(s.kv_dtype))


def state_page_bytes(m: ModelFacts, s: VllmSetup) -> int:
    """One Gated DeltaNet layer's state on one rank (mamba_utils.gated_delta_net_state_shape):
    conv [conv_dim/tp, kernel - 1 + K] in the model dtype, recurrent [Hv/tp, dv, dk] in the
    config's mamba_ssm_dtype (models/config.py Qwen3_5ForConditionalGenerationConfig)."""
    lin = m.linear
    conv = lin.conv_dim // s.tp * (lin.conv_kernel - 1 + s.speculative_tokens) * dtype_bytes(s.weights_dtype)
    ssm = lin.v_heads // s.tp * lin.v_head_dim * lin.k_head_dim * dtype_bytes(lin.ssm_dtype)
    return int(conv + ssm)


def kv_buckets(s: VllmSetup, target: ModelFacts, draft: ModelFacts | None) -> tuple[int, tuple[Bucket, ...]]:
    """(block size, layer buckets with one page size), as vLLM unifies them."""
    block = s.block_size or (CPU_BLOCK if s.device == "cpu" else GPU_BLOCK)
    per_token = attention_token_bytes(target, s)
    state = state_page_bytes(target, s) if target.linear else 0
    if state:  # _align_hybrid_block_size: the attention page must hold one state page
        align = max(KERNEL_BLOCK[s.device], block)
        block = max(block, align * math.ceil(state / (align * per_token)))
    rows = [("target attention", target.attention.layers, per_token)]
    if draft:
        rows.append(("draft attention", draft.attention.layers, attention_token_bytes(draft, s)))
    page = max(block * t for _, n, t in rows if n)
    buckets = [_attention(kind, n, t, block, page, s.max_model_len) for kind, n, t in rows if n]
    if state:
        pages = (2 if s.prefix_caching else 1) + s.speculative_tokens  # MambaSpec.max_memory_usage_bytes
        buckets.append(Bucket("linear-attention state", target.linear.layers, page, 0, pages))
    return block, tuple(buckets)


def _attention(kind: str, layers: int, per_token: int, block: int, page: int, max_len: int) -> Bucket:
    """unify_kv_cache_spec_page_size: a smaller page covers more tokens when it divides the
    largest, else it is padded."""
    tokens = block * (page // (block * per_token)) if page % (block * per_token) == 0 else block
    return Bucket(kind, layers, page, tokens, math.ceil(max_len / tokens))


def group_size(buckets: tuple[Bucket, ...]) -> int:
    """Layers per KV cache group: the fewest of any kind, or the most when every kind is within
    1.5x of the fewest (_get_kv_cache_groups_uniform_page_size)."""
    if not buckets:
        return 0
    fewest, most = min(b.layers for b in buckets), max(b.layers for b in buckets)
    return most if most < fewest * 1.5 else fewest


def needed_bytes(buckets: tuple[Bucket, ...]) -> int:
    return sum(b.layers * b.per_request * b.page for b in buckets)


def longest_len(s: VllmSetup, target: ModelFacts, draft: ModelFacts | None, room: int) -> int:
    """vLLM's estimate_max_model_len: the longest length whose one request fits `room`."""
    from dataclasses import replace

    def fits(length: int) -> bool:
        return needed_bytes(kv_buckets(replace(s, max_model_len=length), target, draft)[1]) <= room
    low, high = 0, s.max_model_len
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def activation_bytes(s: VllmSetup, target: ModelFacts) -> int:
    """Estimate of the profiled forward's transient peak, at max_num_batched_tokens tokens and
    fp32 logits for max_num_seqs rows."""
    return forward_bytes(s, target, s.batched_tokens, s.max_num_seqs)


def forward_bytes(s: VllmSetup, target: ModelFacts, tokens: int, rows: int) -> int:
    """The largest tensors of one forward: per token the residual stream and attention output
    (4 x hidden), the MLP's gate and up projections (2 x FFN / tp) and, on a hybrid, the
    convolution input (conv_dim / tp), in the model dtype; `rows` fp32 logit rows; times
    ACTIVATION_MARGIN for the rest."""
    width = 4 * target.hidden_size + 2 * target.intermediate_size // s.tp
    if target.linear:
        width += target.linear.conv_dim // s.tp
    logits = rows * target.vocab_size * 4
    return int((tokens * width * dtype_bytes(s.weights_dtype) + logits) * ACTIVATION_MARGIN)


def graph_bytes(s: VllmSetup, target: ModelFacts) -> int:
    """Estimate of profile_cudagraph_memory: the first (largest) capture holds one forward of
    its tokens (each decode row verifies 1 + K tokens), each further graph PER_GRAPH; FULL and
    PIECEWISE graphs share one pool, so the first capture counts once."""
    sizes = capture_sizes(s)
    if not sizes:
        return 0
    tokens = min(max(sizes) * (1 + s.speculative_tokens), s.batched_tokens)
    return forward_bytes(s, target, tokens, max(sizes)) + 2 * (len(sizes) - 1) * PER_GRAPH


def capture_sizes(s: VllmSetup) -> list[int]:
    """[1, 2, 4] + 8..248 by 8 + 256.. by 16, up to the largest (_set_cudagraph_sizes)."""
    top = s.max_capture or min(s.max_num_seqs * (1 + s.speculative_tokens) * 2, MAX_CAPTURE)
    top = min(top, s.batched_tokens)
    every = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    return [n for n in every if n <= top]


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"
