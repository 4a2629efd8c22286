"""Memory the runtime holds, measured from its tensors, beside its own prediction from config.json.

Allocation model (the same one ddops.fit uses for this runtime; the rows are
serving.contract.runtime's rules, the parameter and cache bytes serving.contract.sizes'): every
target parameter in the runtime dtype, the target's K/V rows (`kv_dtype`) and the drafter's
projection matrices (`draft_projection_dtype`) in it too, and the drafter's other parameters and
K/V, the state and the prefix store's features in the dtype it computes in (`compute_dtype`: fp32
for bf16 weights on CPU), plus the K/V
preallocated for the server's life. The batch runner holds one target K/V pool over the
full-attention layers of `--max-total-tokens` rows, resolved at start by `resolve_pool`
(contract.runtime.pool_rows: max running sequences x (context + verify rows), within a share
of the device's memory, never below one sequence; the verify rows hold one verify pass past
the context: the method's `verify_rows`, read from its METHODS capabilities); running
sequences share it (serving.engine.kv_pool). With a
speculative method a draft pool of as many rows over the draft's layers sits beside it, and
each admitted sequence's draft context is the same row range as its target reservation
(`draft_kv_rows`). A speculative hybrid is served one sequence at a time (`one_at_a_time`, the
batch runner's slot rule): a pool of context + verify rows (the runtime refuses
`--max-total-tokens`), a draft pool of as many, and one state slot. A dense target's batch runner keeps a prefix store preallocated
beside the pool (`prefix_rows`: 128 blocks x 8 rows of target K/V, plus the drafter's features
per row with a speculative method; serving.engine.prefix_cache; none with
--disable-radix-cache). Hybrid targets add Gated DeltaNet state slots (`state_slots`: one
per running sequence, one when served one at a time): per layer and slot
the conv state ((K-1) x conv channels, runtime dtype) and the recurrent state (Hv x dk x dv,
fp32). Transient, so neither side counts them: the features kept for the draft, a verify
pass's per-row states and tree mask, and what a chunked forward keeps until its commit
(serving.bench.hybrid_staged). /server_info reports both under `memory` (`kv_cache_bytes`:
target and draft K/V together; `prefix_cache_bytes`: the prefix store) so an operator (and a test) can compare prediction and
measurement. The measurement is the runner's own accounting (serving.engine.batch.BatchRunner.info:
its pools' bytes, the prefix store's, the parameters of its target and draft).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from torch import nn

from serving import speculative
from serving.contract import sizes
from serving.contract.runtime import (DEFAULT_MEM_FRACTION, compute_dtype, draft_kv_rows, draft_projection_dtype,
                                      head_copies, kv_dtype, kv_rows,
                                      one_at_a_time, pool_rows, prefix_rows, state_slots)
from serving.contract.sizes import AttentionShape, DeltaNetShape, kv_bytes, linear_state_bytes, model_params
from serving.models.config import LinearAttention, ModelConfig, read_model_config
from serving.models.kv_cache import KVCache
from serving.speculative.draft_model import DraftConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def parameter_bytes(modules: list) -> int:
    """Bytes of the modules' parameters and buffers, a tensor shared between them counted once."""
    seen, total = set(), 0
    for module in modules:
        if not isinstance(module, nn.Module):
            continue
        for tensor in [*module.parameters(), *module.buffers()]:
            key = id(tensor) if tensor.is_mkldnn else tensor.data_ptr()   # a packed weight has no data pointer
            if key not in seen:
                seen.add(key)
                total += tensor.numel() * tensor.element_size()
    return total


@dataclass(frozen=True)
class Layout:
    """What one resolved `args` preallocates, in bytes, before the pool's row count is known."""

    hybrid: bool
    speculative: bool
    own_rows: int          # one sequence at full context: context + verify rows
    weights: int           # target and draft parameters, and the head's packed copy, runtime dtype
    target_row: int        # target K/V of one position over its full-attention layers
    draft_row: int         # the draft's K/V of one position (0 without a drafter)
    state: int             # linear-attention state slots
    prefix: int            # the prefix store

    def kv(self, rows: int, draft_rows: int) -> int:
        return self.target_row * rows + self.draft_row * draft_rows


def layout(args) -> Layout:
    """From config.json (and the draft's), read by the loaders' own parsers."""
    target = read_model_config(Path(args.model_path))
    width = DTYPE_BYTES[args.dtype]                                     # the target's weights
    compute = DTYPE_BYTES[compute_dtype(args.device, args.dtype, target.hybrid)]   # the rest
    weights = (target_params(target) + head_copies(args.device, args.dtype) * target.vocab_size
               * target.hidden_size) * width
    method = speculative.resolve(args.speculative_algorithm)
    draft, verify = None, 0
    if method.speculative and args.speculative_draft_model_path:
        path = args.speculative_draft_model_path
        draft = DraftConfig.from_dict(_config(path), str(Path(path) / "config.json"))
        projections = draft_projections(draft)
        weights += (projections * DTYPE_BYTES[draft_projection_dtype(args.device, args.dtype, target.hybrid)]
                    + (draft_params(draft) - projections) * compute)
        verify = method.verify_rows(args.speculative_num_draft_tokens or draft.block_size,
                                    args.speculative_ddtree_budget)
    target_row = kv_bytes(*KVCache.dims(target), 1, DTYPE_BYTES[kv_dtype(args.device, args.dtype, target.hybrid)])
    draft_row = kv_bytes(draft.num_layers, draft.num_kv_heads, draft.head_dim, 1, compute) if draft else 0
    linear = len(target.linear_layers)
    slots = state_slots(target.hybrid, method.speculative, args.max_running_requests)
    state = slots * linear_state_bytes(_deltanet(target.linear), linear, compute) if linear else 0
    per_row = target_row + (draft.feature_width * compute if draft else 0)
    prefix = prefix_rows(target.hybrid, args.disable_radix_cache) * per_row
    return Layout(target.hybrid, method.speculative, args.context_length + verify, weights,
                  target_row, draft_row, state, prefix)


def resolve_pool(args, memory_bytes: int | None):
    """`args` with --max-total-tokens resolved by the start-up rule (contract.runtime.pool_rows)
    from the device's memory, so the runner allocates it and /server_info reports it; unchanged
    for a target served one sequence at a time, which has no pool to size."""
    L = layout(args)
    if one_at_a_time(L.hybrid, L.speculative):
        return args
    fraction = args.mem_fraction_static or DEFAULT_MEM_FRACTION[args.device]
    rows = pool_rows(L.own_rows, args.max_running_requests, L.target_row + L.draft_row,
                     L.weights + L.state + L.prefix, memory_bytes, fraction, args.max_total_tokens)
    return replace(args, max_total_tokens=rows)


def predict(args) -> dict:
    """Parameter, K/V, state and prefix store bytes for resolved `args`."""
    L = layout(args)
    verify = L.own_rows - args.context_length
    rows = kv_rows(L.hybrid, L.speculative, args.context_length, verify, args.max_total_tokens)
    draft = draft_kv_rows(L.hybrid, L.speculative, args.context_length, verify, args.max_total_tokens)
    kv = L.kv(rows, draft if L.draft_row else 0)
    return {"predicted_weights_bytes": L.weights, "predicted_kv_cache_bytes": kv,
            "predicted_state_cache_bytes": L.state, "predicted_prefix_cache_bytes": L.prefix,
            "predicted_bytes": L.weights + kv + L.state + L.prefix}


def report(measured: dict, args) -> dict:
    """The runner's measured bytes (RunnerInfo.memory) beside the prediction for `args`."""
    return {**measured, "measured_bytes": sum(measured.values()), **predict(args)}


def target_params(c: ModelConfig) -> int:
    """Llama / Qwen3, or a Qwen3.5 hybrid (gated attention beside Gated DeltaNet layers)."""
    attention = AttentionShape(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                               gated=c.hybrid, bias=c.attention_bias, qk_norm=c.qk_norm)
    return model_params(c.vocab_size, c.hidden_size, c.intermediate_size, attention, len(c.full_attention_layers),
                        c.tie_word_embeddings, _deltanet(c.linear), len(c.linear_layers))


def draft_params(c: DraftConfig) -> int:
    """The runtime's DFlash draft layer has no biases and always norms q and k."""
    return sizes.draft_params(_draft_attention(c), c.intermediate_size, c.num_layers, len(c.target_layer_ids),
                              c.vocab_size, c.conv_kernel, c.conv_group, c.selector_rank)


def draft_projections(c: DraftConfig) -> int:
    return sizes.draft_projection_params(_draft_attention(c), c.intermediate_size, c.num_layers,
                                         len(c.target_layer_ids))


def _draft_attention(c: DraftConfig) -> AttentionShape:
    return AttentionShape(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, qk_norm=True)


def _deltanet(L: LinearAttention | None) -> DeltaNetShape | None:
    return None if L is None else L.shape


def _config(model_dir: str) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())
