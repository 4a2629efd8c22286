"""How the bundled runtime lays out its state memory, which ddops' fit predicts (stdlib only).

The runtime preallocates one KV pool (serving.engine) and, for hybrid targets, Gated DeltaNet
state slots: a hybrid decoding plainly joins the batch runner and gets a slot per running
sequence; a hybrid with a speculative method is served one sequence at a time (speculative
rounds have no batched form for its recurrent state) and holds one. Dense targets hold none.
"""

from __future__ import annotations

DEFAULT_MAX_RUNNING = 32  # --max-running-requests when unset


def state_slots(hybrid: bool, speculative: bool, max_running: int | None) -> int:
    """Linear-attention state slots the runtime preallocates."""
    if not hybrid:
        return 0
    return 1 if speculative else max_running or DEFAULT_MAX_RUNNING
