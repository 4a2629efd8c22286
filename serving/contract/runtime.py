"""How the bundled runtime serves and lays out its memory, which ddops' fit predicts (stdlib only).

The runtime preallocates the target's K/V (one pool in the batch runner, one cache in the
speculative hybrid's pool of one sequence), the draft's context K/V for as many rows (a draft pool beside the target
pool, or one cache), the prefix store (`prefix_rows`, none with --disable-radix-cache), and,
for hybrid targets, Gated DeltaNet state slots. `one_at_a_time` is
the one rule for which targets the batch runner cannot take:
a hybrid target (a recurrent linear-attention state) has a batched plain decode step but no
packed forward over many sequences' verify trees, so with a speculative method it is served one
sequence at a time and holds one slot; decoding plainly it joins the batch runner with a slot
per running sequence. Dense targets hold none.
"""

from __future__ import annotations

DEFAULT_MAX_RUNNING = 32  # --max-running-requests when unset
# --mem-fraction-static when unset: the share of the device's memory that weights and
# preallocated K/V may take. CUDA: about SGLang's default on a 48 GB card (its reserve heuristic
# gives 0.85-0.86 there), a card the server has to itself. CPU: half, since the host's memory
# also holds the OS, the tokenizer, Python's heap, activations and other services.
DEFAULT_MEM_FRACTION = {"cpu": 0.5, "cuda": 0.85}
PREFIX_BLOCK = 8  # prompt tokens per prefix-cache block
PREFIX_BLOCKS = 128  # blocks the prefix cache keeps


def one_at_a_time(hybrid: bool, speculative: bool) -> bool:
    """The runtime serves a single sequence at a time (the batch runner's slot rule for this target)."""
    return hybrid and speculative


def state_slots(hybrid: bool, speculative: bool, max_running: int | None) -> int:
    """Linear-attention state slots the runtime preallocates."""
    if not hybrid:
        return 0
    return 1 if one_at_a_time(hybrid, speculative) else max_running or DEFAULT_MAX_RUNNING


def max_total_tokens_problem(hybrid: bool, speculative: bool, max_total_tokens: int | None) -> str | None:
    """Why --max-total-tokens cannot be honoured, one line, or None. A target served one sequence
    at a time has no shared pool for it to size (its cache is context + verify rows), so the
    runtime refuses it at start rather than ignore it, and ddops refuses such a profile before
    touching a host."""
    if max_total_tokens is None or not one_at_a_time(hybrid, speculative):
        return None
    return ("--max-total-tokens: a hybrid target with a speculative method is served one "
            "sequence at a time from its own cache of context + verify rows, so there is no pool "
            "for it to size; remove it (--context-length sets that cache)")


def pool_rows(own_rows: int, max_running: int | None, row_bytes: int, fixed_bytes: int,
              memory_bytes: int | None, fraction: float, max_total_tokens: int | None) -> int:
    """The batch runner's pool, resolved once at start (the start-up rule; the runtime then
    runs with it as --max-total-tokens). Enough rows for every running sequence at full
    context (`max_running` x (context + verify) = `own_rows`; no more can ever be reserved at
    once), capped where `fraction` of the device's memory (`memory_bytes`: CPU the host's or
    its cgroup's limit, CUDA the card's free memory before the weights load; None: not
    known, no cap) less what else is preallocated (`fixed_bytes`: weights, prefix store,
    state slots) holds fewer rows of `row_bytes` (target and draft K/V of one position),
    never below one full sequence; an explicit --max-total-tokens caps it further (SGLang's
    meaning of the flag)."""
    rows = (max_running or DEFAULT_MAX_RUNNING) * own_rows
    if memory_bytes is not None:
        room = (int(fraction * memory_bytes) - fixed_bytes) // max(row_bytes, 1)
        rows = max(own_rows, min(rows, room))
    return min(rows, max_total_tokens) if max_total_tokens else rows


def kv_rows(hybrid: bool, speculative: bool, context_length: int, verify_rows: int,
            max_total_tokens: int | None) -> int:
    """Rows of target K/V preallocated over its full-attention layers: one sequence's cache of
    context + verify rows when served one at a time (where the runtime refuses
    --max-total-tokens: `max_total_tokens_problem`), else the batch runner's pool of
    --max-total-tokens rows (the runtime resolves the flag at start by `pool_rows`; unset here,
    one sequence's rows)."""
    own = context_length + verify_rows
    return own if one_at_a_time(hybrid, speculative) else max_total_tokens or own


def draft_kv_rows(hybrid: bool, speculative: bool, context_length: int, verify_rows: int,
                  max_total_tokens: int | None) -> int:
    """Rows of draft context K/V preallocated for the server's life, over the draft's layers
    (a method with a drafter): the target's `kv_rows`. A target served one sequence at a time reserves
    context + verify rows at start and reuses them for every sequence; the batch runner keeps a
    draft pool beside the target's, and each admitted sequence's draft context is the same row
    range as its target reservation (a round's draft block fits wherever its verify rows fit)."""
    return kv_rows(hybrid, speculative, context_length, verify_rows, max_total_tokens) if speculative else 0


def prefix_rows(hybrid: bool, disable_radix_cache: bool) -> int:
    """Rows of the prefix store the runtime preallocates (PREFIX_BLOCKS x PREFIX_BLOCK), each
    holding one prompt position's target K/V over the full-attention layers and, with a drafter,
    its target features (the draft's feature width, runtime dtype). Only a dense target keeps
    one (the batch runner's packed prefill); a hybrid's prompt leaves a recurrent state, not rows.
    `--disable-radix-cache` (SGLang's spelling) turns it off: no store, no reuse."""
    return 0 if hybrid or disable_radix_cache else PREFIX_BLOCKS * PREFIX_BLOCK


# The dtypes whose products run packed on CPU (oneDNN's layout, or bf16's blocked kernel: serving.models.cpu_gemm).
PACKED_ON_CPU = ("float32", "bfloat16")


def head_copies(device: str, dtype: str) -> int:
    """Copies of the LM head [vocab, hidden] the runtime keeps beside its parameters: on CPU at
    a packed dtype one, packed for the head's product (serving.models.cpu_gemm.pack_matrices;
    the dense matrix stays for the embedding lookup and the rows drafters read); none elsewhere."""
    return 1 if device == "cpu" and dtype in PACKED_ON_CPU else 0


def compute_dtype(device: str, dtype: str, hybrid: bool) -> str:
    """The dtype a target of weights in `dtype` computes in: its activations, K/V, recurrent and
    prefix rows, and its drafter (weights and all). On CPU a dense target's bf16 weights are
    read by packed products that round each input row to bf16 and sum in fp32
    (serving.models.cpu_gemm), and everything between the products runs in fp32: on a 2-core AMD
    EPYC (avx512_bf16) that ran a SmolLM2 decode step in 30.8 ms against 36.0 with bf16
    activations (fp32: 56.0; docs/serving.md "bf16 on CPU"), and it keeps plain and verify
    passes' attention in fp32, where bf16 rounding would let their different summation orders
    change a greedy token. A hybrid target's products are not packed, so it computes in its
    weights' dtype, as every target does on CUDA."""
    return "float32" if device == "cpu" and dtype == "bfloat16" and not hybrid else dtype


def draft_projection_dtype(device: str, dtype: str, hybrid: bool) -> str:
    """The dtype a drafter's projection matrices (fc, each layer's q/k/v/o and gate/up/down:
    sizes.draft_projection_params) are kept in: its target's weights'. Where the target computes
    in fp32 over bf16 weights (compute_dtype), they run through the same packed bf16 products as
    the target's, fp32 between them: SmolLM2's draft pass 6.2 -> 3.5 ms on one core. Its other
    parameters (norms, DFlash 2's convs and selector) stay in the compute dtype."""
    return dtype


def kv_dtype(device: str, dtype: str, hybrid: bool) -> str:
    """The dtype a target's K/V rows (pool and prefix store) are kept in: its weights'. Where it
    computes in fp32 over bf16 weights (compute_dtype), its rows are rounded to bf16 as they are
    written and widen to fp32 as attention reads them, so every product and sum stays fp32 while
    a step reads half the bytes (serving/kernels/decode_attention.c) and the pool holds twice the
    rows. Every pass reads the same stored bits, so speculative output still equals plain output.
    The drafter's own K/V stay in the compute dtype, its activations'."""
    return dtype


def cpu_flags(cpuinfo: str | None) -> frozenset[str]:
    """The instruction-set flags in /proc/cpuinfo's text (its first `flags` line); empty without one."""
    for line in (cpuinfo or "").splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: frozenset[str]) -> bool:
    """The CPU multiplies bf16 itself (AVX512_BF16's VDPBF16PS, or AMX tiles); elsewhere oneDNN
    would emulate bf16 products, slower than fp32 ones."""
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def auto_dtype(device: str, declared: str, flags: frozenset[str]) -> str:
    """--dtype auto. CUDA: the checkpoint's dtype (`declared`, bfloat16 when it declares none the
    runtime runs). CPU: bfloat16 for a bf16 checkpoint on a CPU with native bf16 products, which
    halves the bytes a decode step streams; float32 otherwise, which holds bf16 and fp16 weights
    exactly (no fp16 products on CPU, and an fp32 checkpoint is not rounded unasked)."""
    if device == "cuda":
        return declared
    return "bfloat16" if declared == "bfloat16" and native_bf16(flags) else "float32"
