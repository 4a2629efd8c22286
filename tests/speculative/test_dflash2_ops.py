"""DFlash 2 drafts on the ops side: both preflights decide from the one architecture table
(serving/contract/drafts.py) and agree rule for rule; `ddops fit` counts a package-saved draft's
parameters exactly; a runtime or version that cannot build a DFlash 2 draft is a planning
refusal (exit 2 before any restart), the bundled runtime builds it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import transformers  # noqa: E402  (dev dependency)
from dflash import model as dflash_model
from ddops.checkpoint import LocalFiles
from ddops.commands.preflight import check_profile
from ddops.deploy.draft_load import load_refusals, problems as load_problems, sglang_problems
from ddops.deploy.refusals import refusals
from ddops.fit.model import facts_from_config
from ddops.fit.read import read_model
from ddops.draft_pairing import check_pair, read_pair
from ddops.profile import load_profile
from ddops.profile.runtimes import VLLM
from serving.speculative.preflight import problems as runtime_problems
from serving.tools.tiny import write_tiny
from tests.deploy.test_refusals import LocalShell, checks
from tests.deploy.test_vllm_draft_refusal import shell_knowing_vllm_flags, venv_with, vllm_unit

DFLASH2 = {"block_size": 4, "mask_token_id": 0, "target_layer_ids": [1, 2], "conv_group_size": 8,
           "conv_kernel_size": 2, "selector_rank": 8, "selector_top_k": 16}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target dir, DFlash 2 draft dir saved by the package's save_pretrained, its parameter count)."""
    root = tmp_path_factory.mktemp("ops")
    target = write_tiny(root / "tiny-llama", "llama")
    c = json.loads((target / "config.json").read_text())
    config = transformers.Qwen3Config(
        hidden_size=c["hidden_size"], intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=c["vocab_size"], max_position_embeddings=64,
        num_target_layers=c["num_hidden_layers"], dflash_config=DFLASH2, layer_types=["full_attention"] * 2)
    model = dflash_model.DFlash2DraftModel(config)
    draft = root / "tiny-llama-dflash"
    model.save_pretrained(draft)
    return target, draft, sum(p.numel() for p in model.parameters())


def edited(draft, tmp_path, change) -> str:
    out = tmp_path / "tiny-llama-dflash"
    out.mkdir()
    (out / "model.safetensors").symlink_to(draft / "model.safetensors")
    (out / "config.json").write_text(json.dumps(change(json.loads((draft / "config.json").read_text()))))
    return str(out)


def fields(**values):
    return lambda c: {**c, "dflash_config": {**c["dflash_config"], **values}}


# (case, config change, the key every reason names on both sides; None = fits)
CASES = [
    ("fits", lambda c: c, None),
    ("unknown architecture", lambda c: {**c, "architectures": ["DFlash3DraftModel"]}, "draft architectures"),
    ("group does not divide hidden", fields(conv_group_size=7), "draft dflash_config.conv_group_size"),
    ("kernel 0", fields(conv_kernel_size=0), "draft dflash_config.conv_kernel_size"),
    ("top_k over the vocabulary", fields(selector_top_k=10**6), "draft dflash_config.selector_top_k"),
    ("selector fields absent", lambda c: {**c, "dflash_config": DFLASH2 | {"selector_rank": None}},
     "draft dflash_config.selector_rank"),
    ("selector vocabulary differs", lambda c: {**c, "vocab_size": c["vocab_size"] + 1}, "draft vocab_size"),
]


@pytest.mark.parametrize("case, change, key", CASES, ids=[c[0] for c in CASES])
def test_both_preflights_apply_the_architecture_table(pair, tmp_path, case, change, key):
    target, draft, _ = pair
    path = edited(draft, tmp_path, change)
    ops = check_pair(read_pair(LocalFiles(), str(target), path))            # what `ddops preflight` runs
    assert [p.key for p in ops] == ([key] if key else []), ops
    run = subprocess.run([sys.executable, "-m", "serving.speculative.preflight", path, str(target)],
                         capture_output=True, text=True)                     # the runtime's start-up check
    assert run.returncode == (1 if key else 0), run.stderr
    config = json.loads((tmp_path / "tiny-llama-dflash" / "config.json").read_text())
    assert len(runtime_problems(config, json.loads((target / "config.json").read_text()))) == len(ops)
    if key == "draft architectures":
        assert "DFlash3DraftModel is not one the runtime can build" in run.stderr


def test_ddops_preflight_of_a_profile_with_a_dflash2_draft(pair, tmp_path):
    target, draft, _ = pair
    prof = load_profile("cpu-dflash")
    assert [str(p) for p in check_profile(prof, LocalFiles(), draft.parent)] == []
    edited(draft, tmp_path, lambda c: {**c, "architectures": ["DFlash3DraftModel"]})
    (tmp_path / "tiny-llama").symlink_to(target)
    [problem] = check_profile(prof, LocalFiles(), tmp_path)
    assert problem.key == "draft architectures"


def test_fit_counts_the_draft_exactly_from_headers_and_from_the_config(pair):
    _, draft, params = pair
    facts = read_model(LocalFiles(), str(draft))
    assert facts.params_source == "safetensors headers" and facts.params == params
    estimated = facts_from_config(json.loads((draft / "config.json").read_text()), str(draft))
    assert estimated.params_source == "config estimate" and estimated.params == params
    assert facts.block_size == DFLASH2["block_size"]   # read from dflash_config, as the package does


def test_sglang_before_dflash2_is_refused_and_from_0_5_19_it_loads(pair):
    _, draft, _ = pair
    config = json.loads((draft / "config.json").read_text())
    [reason] = sglang_problems("0.5.18", config, "/m/d")
    assert reason == ("draft /m/d: SGLang 0.5.18 cannot load a DFlash2DraftModel draft: it loads from "
                      "SGLang 0.5.19 (--speculative-algorithm DFLASH)")
    assert sglang_problems("0.5.19", config, "/m/d") == sglang_problems("0.5.23+ddtree", config, "/m/d") == []
    assert sglang_problems("0.5.15", {**config, "architectures": ["DFlashDraftModel"]}, "/m/d") == []


def test_the_sglang_host_version_decides_the_planning_refusal(pair, tmp_path):
    target, draft, _ = pair
    python = venv_with(tmp_path, "sglang")   # METADATA says version 0.5.15... rewritten below
    [info] = (tmp_path / "venv").glob("lib/python3*/site-packages/sglang-*.dist-info")
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(target), "--speculative-algorithm",
            "DFLASH", "--speculative-draft-model-path", str(draft)]
    for version, refused in (("0.5.18", True), ("0.5.19", False)):
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
        found = load_refusals(LocalShell(), argv)
        assert bool(found) == refused and all("0.5.19" in r for r in found), found


def test_vllm_cpu_build_refuses_a_dflash2_draft_before_any_restart(pair, tmp_path):
    target, draft, _ = pair
    cpu, cuda = VLLM.build_among({"vllm-cpu"}), VLLM.build_among({"vllm"})
    config, target_config = json.loads((draft / "config.json").read_text()), json.loads((target / "config.json").read_text())
    where = {"target": "/m/t", "draft": "/m/d"}
    cpu_reasons = [r for r in load_problems(VLLM, cpu, target_config, config, where) if "cannot build" in r]
    assert cpu_reasons == ["draft /m/d is a DFlash2DraftModel, which the installed cpu build (vllm-cpu) cannot "
                           "build (it builds DFlashDraftModel)"]
    assert not [r for r in load_problems(VLLM, cuda, target_config, config, where) if "cannot build" in r]
    python = venv_with(tmp_path, "vllm-cpu")
    found = refusals(shell_knowing_vllm_flags(python), vllm_unit(python, str(target), str(draft)))
    assert "load" in checks(found) and any("DFlash2DraftModel" in r.reason for r in found)


def test_the_bundled_runtime_builds_it(pair):
    from serving.speculative.dflash import load_model

    _, draft, params = pair
    model = load_model(draft, torch.float32, "cpu")
    assert model.candidate_selector is not None and all(layer.mlp_conv is not None for layer in model.layers)
    assert sum(p.numel() for p in model.parameters()) == params
