"""Shape rules SGLang enforces before it allocates anything, checked from config.json.

Tensor parallelism splits attention heads across ranks, so (SGLang's model loaders assert it):
- num_attention_heads % tp == 0, for the target and for the draft;
- KV heads: when num_key_value_heads >= tp they must divide evenly (num_key_value_heads % tp
  == 0, each rank holds num_key_value_heads / tp); when fewer, tp % num_key_value_heads == 0
  and each rank holds one replicated KV head.
A config without num_key_value_heads is read with the Hugging Face default,
num_key_value_heads = num_attention_heads (full multi-head attention); `fit` says so.
"""

from __future__ import annotations

from ddops.fit.model import ModelFacts


def _roles(target: ModelFacts, draft: ModelFacts | None) -> list[tuple[str, ModelFacts]]:
    return [("target", target)] + ([("draft", draft)] if draft else [])


def tp_problems(target: ModelFacts, draft: ModelFacts | None, tp: int) -> list[str]:
    """One line per rule `tp` breaks for the target or the draft."""
    found = []
    for role, m in _roles(target, draft):
        heads, kv = m.attention_heads, m.attention.kv_heads
        if not heads:
            continue
        if heads % tp:
            found.append(f"tp {tp} does not divide the {role}'s num_attention_heads={heads} "
                         f"(SGLang splits attention heads evenly over the tensor-parallel ranks)")
        elif (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            found.append(f"tp {tp} does not fit the {role}'s num_key_value_heads={kv}: KV heads must "
                         f"divide by tp (when >= tp) or divide tp (when fewer; each rank keeps a copy)")
    return found


def kv_head_notes(target: ModelFacts, draft: ModelFacts | None) -> list[str]:
    return [f"{role} {m.path}: config.json has no num_key_value_heads; taken as num_attention_heads="
            f"{m.attention_heads} (the Hugging Face default: full multi-head KV)"
            for role, m in _roles(target, draft) if m.attention_heads and not m.kv_heads_declared]


def bounded_window(low: float, high: float) -> dict:
    """The working --mem-fraction-static range as reported: inside (0, 1], or none."""
    if not (low <= high and high > 0 and low <= 1):
        return {"min": None, "max": None, "exists": False}
    return {"min": max(low, 0.001), "max": min(high, 1.0), "exists": True}
