"""How the bundled runtime serves and lays out its state memory, which ddops' fit predicts (stdlib only).

The runtime preallocates one KV pool (serving.engine) and, for hybrid targets, Gated DeltaNet
state slots. `one_at_a_time` is the one rule for which targets the batch runner cannot take:
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
