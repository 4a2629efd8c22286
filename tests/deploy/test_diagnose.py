"""The diagnosis catalog, tested from the real texts each failure prints."""

import pytest

from ddops.diagnose import CATALOG, diagnose

# (journal excerpt as printed by the real program, expected cause, a word the next step must hold)
CASES = [
    # SGLang <= 0.5.1x, model_runner_kv_cache_mixin
    ("[2026-05-01 10:00:01 TP0] Load weight end. type=Qwen3ForCausalLM, mem usage=15.26 GB.\n"
     "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
     "Current value: self.server_args.mem_fraction_static=0.5",
     "kv-cache-no-memory", "raise mem_fraction_static"),
    # SGLang 0.5.15+ wording, with the computed minimum
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under "
     "--mem-fraction-static=0.6. Raise --mem-fraction-static above 0.712 (minimum viable = "
     "1 - available/pre = 0.712). If using speculative decoding, draft weights are now counted.",
     "kv-cache-no-memory", "above 0.712"),
    ("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB\n"
     "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
     "cuda-graph-capture-failed", "cuda_graph_max_bs"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total "
     "capacity of 47.41 GiB of which 1.03 GiB is free.",
     "cuda-oom-serving", "lower mem_fraction_static"),
    ("Scheduler hit an exception: Traceback (most recent call last):\n"
     "RuntimeError: mat1 and mat2 shapes cannot be multiplied (7x10240 and 12800x2560)",
     "draft-target-width-mismatch", "pair the draft"),
    ("ddops-serve: preflight failed: draft fc input width 96 does not match target: "
     "3 target layers x hidden 48 = 144",
     "draft-target-width-mismatch", "preflight"),
    # our runtime's start-up preflight (serving/speculative/preflight.py), as the unit logs it
    ("PreflightError: draft expects 96 = 2 layers x 48 but the target provides 2 x 64 = 128; "
     "draft hidden_size 48 but the target hidden_size is 64 (embeddings and lm_head are shared)",
     "draft-target-width-mismatch", "preflight"),
    ("serving.speculative.preflight.PreflightError: draft expects 128 = 2 layers x 64 but the target "
     "captured 192 features per token",
     "draft-target-width-mismatch", "pair the draft"),
    ("OSError: /var/lib/ddops/models/gone does not appear to have a file named config.json.",
     "model-path-missing", "push-model"),
    # our runtime (serving/__main__.py), as the journal shows it
    ("llm[4867]: error: /var/lib/ddops/models/not-pushed: model directory does not exist",
     "model-path-missing", "push-model"),
    ("FileNotFoundError: [Errno 2] No such file or directory: "
     "'/var/lib/ddops/models/gone/config.json'",
     "model-path-missing", "push-model"),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('10.231.0.21', 30000): "
     "address already in use",
     "port-in-use", "port"),
    ("launch_server.py: error: unrecognized arguments: --speculative-dflash-draft-window-size 4",
     "bad-flag", "rename the flag"),
    ("launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match "
     "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",
     "bad-flag", "spelling"),
    ("ddops-llm.service: Failed to locate executable /opt/ddops/venv/bin/python: "
     "No such file or directory\nddops-llm.service: Main process exited, code=exited, "
     "status=203/EXEC",
     "runtime-missing", "install-runtime"),
    ("Rank 0 scheduler died during initialization (exit code: -9, signal: SIGKILL)",
     "host-oom-killed", "dmesg"),
    ("Initialization failed. warmup error: 403 Forbidden", "warmup-failed", "NO_PROXY"),
    ("Scheduler hit an exception: Traceback (most recent call last):\n  File \"x.py\"\n"
     "KeyError: 'rope_theta'",
     "runtime-crash", "logs"),
]


@pytest.mark.parametrize("journal,cause,hint", CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)])
def test_each_real_message_maps_to_its_cause(journal, cause, hint):
    finding = diagnose(journal)[0]      # the first finding: what a failed deploy reports as its cause
    assert finding.cause == cause
    assert hint in finding.next_step
    assert finding.evidence and finding.evidence in journal


def test_runtime_preflight_numbers_reach_the_summary():
    finding = diagnose(CASES[6][0])[0]
    assert "expects 96" in finding.summary and "2 x 64 = 128" in finding.summary


def test_newer_wording_carries_the_minimum_fraction_into_the_summary():
    finding = diagnose(CASES[1][0])[0]
    assert "0.6" in finding.summary and "0.712" in finding.next_step


def test_specific_cause_wins_over_the_generic_crash_and_each_cause_appears_once():
    journal = CASES[4][0] + "\n" + CASES[4][0]
    causes = [f.cause for f in diagnose(journal)]
    assert causes[0] == "draft-target-width-mismatch"
    assert "runtime-crash" in causes
    assert len(causes) == len(set(causes))


def test_ordinary_startup_lines_match_nothing():
    journal = ("Started ddops-llm.service.\nINFO: loading model /var/lib/ddops/models/tiny\n"
               "INFO: Uvicorn running on http://10.231.0.21:30000\n"
               "The server is fired up and ready to roll!")
    assert diagnose(journal) == []


def test_every_rule_is_exercised_by_a_real_message():
    from tests.deploy.test_diagnose_vllm import JOURNALS
    tested = {c[1] for c in CASES} | {j[1] for j in JOURNALS}
    untested = {r.cause for r in CATALOG} - tested - {"draft-layer-out-of-range", "mamba-state-no-memory"}
    assert not untested
