"""How the bundled runtime serves and lays out its memory, which ddops' fit predicts (stdlib only).

The runtime preallocates the target's K/V (one pool in the batch runner, one cache in the
one-sequence decoder), the draft's context K/V when it serves one sequence at a time, and, for
hybrid targets, Gated DeltaNet state slots. `one_at_a_time` is the one rule for which targets the batch runner cannot take:
a hybrid target (a recurrent linear-attention state) has a batched plain decode step but no
packed forward over many sequences' verify trees, so with a speculative method it is served one
sequence at a time and holds one slot; decoding plainly it joins the batch runner with a slot
per running sequence. Dense targets hold none.
"""

from __future__ import annotations

DEFAULT_MAX_RUNNING = 32  # --max-running-requests when unset


def one_at_a_time(hybrid: bool, speculative: bool) -> bool:
    """The runtime serves a single sequence at a time (its one-sequence decoder, not the batch runner)."""
    return hybrid and speculative


def state_slots(hybrid: bool, speculative: bool, max_running: int | None) -> int:
    """Linear-attention state slots the runtime preallocates."""
    if not hybrid:
        return 0
    return 1 if one_at_a_time(hybrid, speculative) else max_running or DEFAULT_MAX_RUNNING


def kv_rows(hybrid: bool, speculative: bool, context_length: int, verify_rows: int,
            max_total_tokens: int | None) -> int:
    """Rows of target K/V preallocated over its full-attention layers: one sequence's cache of
    context + verify rows when served one at a time (--max-total-tokens does not apply), else
    the batch runner's pool of --max-total-tokens rows, by default that same figure."""
    own = context_length + verify_rows
    return own if one_at_a_time(hybrid, speculative) else max_total_tokens or own


def draft_kv_rows(hybrid: bool, speculative: bool, context_length: int, verify_rows: int) -> int:
    """Rows of draft context K/V preallocated for the server's life, over the draft's layers: the
    one-sequence decoder reserves context + verify rows at start and reuses them for every
    sequence. The batch runner preallocates none: it gives each admitted sequence a draft cache of
    the rows it reserved in the pool and frees it with the sequence (at most the pool's rows at once)."""
    return context_length + verify_rows if one_at_a_time(hybrid, speculative) else 0
