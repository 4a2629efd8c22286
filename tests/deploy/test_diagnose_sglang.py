"""The diagnosis catalog on SGLang 0.5.15's own journals of each start-up failure
(tests/deploy/journals/sglang/, each provoked on a lab host; README.md there says how)."""

from pathlib import Path

import pytest

from ddops.diagnose import diagnose

JOURNALS_DIR = Path(__file__).parent / "journals" / "sglang"

# (journal, cause, what the evidence must hold, what the next step must hold, other causes allowed)
JOURNALS = [
    ("unknown-flag", "bad-flag", "--speculative-ddtree-budget-typo", "remove or rename the flag", set()),
    ("missing-model", "model-path-missing", "/var/lib/ddops/models/not-pushed", "ddops push-model",
     {"runtime-crash"}),
    # the warm-up request SGLang sends itself reached the process that held the port
    ("port-in-use", "port-in-use", "30320", "choose another port", {"runtime-crash", "warmup-failed"}),
    ("not-enough-memory", "kv-cache-no-memory", "--mem-fraction-static=0.01", "raise mem_fraction_static above 0.060",
     {"runtime-crash"}),
]


@pytest.mark.parametrize("name,cause,evidence,next_step,others", JOURNALS, ids=[j[0] for j in JOURNALS])
def test_each_sglang_failure_is_named_with_its_next_step(name, cause, evidence, next_step, others):
    text = (JOURNALS_DIR / f"{name}.log").read_text()
    finding = diagnose(text)[0]
    assert finding.cause == cause, finding
    assert evidence in finding.evidence and finding.evidence in text, finding.evidence
    assert next_step in finding.next_step, finding.next_step
    assert {f.cause for f in diagnose(text)} - {cause} <= others


def test_every_journal_here_is_in_the_table():
    assert {p.stem for p in JOURNALS_DIR.glob("*.log")} == {j[0] for j in JOURNALS}
