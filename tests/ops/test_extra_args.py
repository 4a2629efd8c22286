"""sglang.extra_args: unmodelled SGLang flags passed through, checked against the version table,
refused when ddops renders the flag itself, and warned about by `ddops fit` when they change memory."""

from __future__ import annotations

import json


from ddops.profile import ConfigError, load_profile
from ddops.render import command_line
from tests.fit.test_cli import fit
from tests.ops.helpers import write



def problems_of(tmp_path, text: str) -> str:
    path = write(tmp_path, "p", text)
    try:
        load_profile(str(path))
    except ConfigError as err:
        return "\n".join(err.problems)
    return ""


def test_extra_args_are_appended_as_written(tmp_path):
    path = write(tmp_path, "p", "extends: cpu-ar\nsglang: {extra_args: [--tool-call-parser, qwen25, --enable-metrics]}\n")
    argv = command_line(load_profile(str(path)))
    assert argv[-3:] == ["--tool-call-parser", "qwen25", "--enable-metrics"]


def test_a_removed_flag_is_named_with_its_replacement(tmp_path):
    found = problems_of(tmp_path, "extends: a6000-base\nsglang: {extra_args: [--mamba-scheduler-strategy, auto]}\n")
    assert "--mamba-scheduler-strategy was removed in SGLang 0.5.23; use --mamba-radix-cache-strategy" in found


def test_a_flag_ddops_renders_is_refused_naming_its_key(tmp_path):
    found = problems_of(tmp_path, "extends: cpu-ar\nsglang: {extra_args: [--context-length, '9']}\n")
    assert "--context-length is rendered by ddops from memory.context_length" in found
    found = problems_of(tmp_path, "extends: a6000-base\nsglang: {extra_args: [--cuda-graph-max-bs-decode, '8']}\n")
    assert "from cuda_graph.max_bs" in found       # the 0.5.23 spelling of a modelled flag


def test_words_must_be_one_line_and_start_with_a_flag(tmp_path):
    found = problems_of(tmp_path, 'extends: cpu-ar\nsglang: {extra_args: [qwen25, "--x\\nExecStartPre=/bin/sh"]}\n')
    assert "sglang.extra_args[0]" in found and "starts with a flag" in found
    assert "sglang.extra_args[1]" in found and "one printable line" in found


def test_fit_warns_about_a_memory_relevant_extra_arg(tmp_path):
    path = write(tmp_path, "q", "extends: a6000-balanced\nsglang: {extra_args: [--quantization, fp8]}\n")
    result = fit(str(path), "--gpu", "a6000", "--json")
    notes = json.loads(result.stdout)["notes"]
    assert any("--quantization changes memory use" in n for n in notes), notes


def test_a_flag_fit_reads_must_carry_a_positive_integer(tmp_path):
    for words in ("[--max-total-tokens, lots]", "[--max-total-tokens]", "['--max-total-tokens=0']",
                  "[--max-total-tokens, --enable-metrics]"):
        found = problems_of(tmp_path, f"extends: cpu-ar\nsglang: {{extra_args: {words}}}\n")
        assert "--max-total-tokens" in found and "must be a positive integer" in found, words
    assert problems_of(tmp_path, "extends: cpu-ar\nsglang: {extra_args: [--max-total-tokens, '600']}\n") == ""


def test_fit_models_max_total_tokens_instead_of_warning(tmp_path):
    path = write(tmp_path, "m", "extends: a6000-balanced\nsglang: {extra_args: [--max-total-tokens, '9000']}\n")
    report = json.loads(fit(str(path), "--gpu", "a6000", "--json").stdout)
    assert not any("--max-total-tokens" in n for n in report["notes"]), report["notes"]
    assert report["kv_pool_tokens"] == 9000, report


def test_the_prefix_cache_switch_is_accepted_bare_and_refused_with_a_value(tmp_path):
    for base in ("cpu-ar", "a6000-base"):       # the bundled runtime and SGLang spell it alike
        assert problems_of(tmp_path, f"extends: {base}\nsglang: {{extra_args: [--disable-radix-cache]}}\n") == ""
    for words in ("['--disable-radix-cache=true']", "[--disable-radix-cache, 'yes']"):
        found = problems_of(tmp_path, f"extends: cpu-ar\nsglang: {{extra_args: {words}}}\n")
        assert "--disable-radix-cache" in found and "takes no value" in found, words
