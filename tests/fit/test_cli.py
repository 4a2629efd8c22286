"""`ddops fit` and the validate warning through the CLI (Typer's runner and the real entry point)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from ddops.cli import app
from tests.fit.conftest import CONFIGS
from tests.ops.helpers import write

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def fit(*args: str):
    return runner.invoke(app, ["fit", *args], env={"DDOPS_PROFILES": str(REPO / "profiles"),
                                                   "DDOPS_FIT_MODELS": str(CONFIGS)})


def test_fit_json_for_a_profile_that_fits():
    result = fit("a6000-balanced", "--gpu", "RTX A6000", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["fits"] is True and doc["gpu"] == {"kind": "RTX A6000", "memory_mib": 49140, "count": 2}
    assert doc["kv_pool_tokens"] > doc["context_length"] == 8192
    assert doc["window"]["exists"] and doc["window"]["min"] < 0.85 <= doc["window"]["max"]
    assert doc["per_gpu_bytes"]["kv_per_token"] == 43008
    assert doc["models"]["target"]["params_source"] == "config estimate"


def test_fit_on_one_card_exits_1_and_says_why():
    result = fit("a6000-base", "--gpu", "a6000", "--tp", "1")
    assert result.exit_code == 1
    assert "does not fit 1 x RTX A6000" in result.stdout
    assert "weights alone need" in result.stdout and "model.tp_size 2 fits" in result.stdout


def test_fit_with_memory_instead_of_a_kind():
    result = fit("a6000-base", "--gpu-mem-gib", "141", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["gpu"]["memory_mib"] == 144384


def test_unknown_gpu_is_bad_input_naming_the_known_kinds():
    result = fit("a6000-base", "--gpu", "TPU v5")
    assert result.exit_code == 2
    assert "unknown GPU kind" in result.output and "RTX A6000" in result.output


def test_unreadable_models_are_bad_input_naming_the_file():
    result = runner.invoke(app, ["fit", "a6000-base", "--gpu", "a6000", "--models", "/nonexistent"],
                           env={"DDOPS_PROFILES": str(REPO / "profiles")})
    assert result.exit_code == 2 and "/nonexistent/Qwen3.6-27B/config.json" in result.output


def test_bundled_profile_reports_its_exact_allocation(tmp_path):
    write(tmp_path, "tiny", f"""\
        runtime: bundled
        model: {{path: {CONFIGS / 'Qwen3-8B'}, served_name: q}}
        memory: {{context_length: 1024}}
        """)
    result = runner.invoke(app, ["fit", "tiny", "--profiles-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    memory = json.loads(result.stdout)["memory"]
    # the start-up rule: 32 running sequences (the default) at full context; without --host fit
    # does not know the host's memory, so it applies no cap and says the figure is not exact
    assert memory["dtype"] == "float32" and memory["kv_slots"] == 32 * 1024
    assert memory["kv_cache_bytes"] == 36 * 8 * 256 * 4 * 32 * 1024
    assert memory["pool"]["exact"] is False and memory["pool"]["memory_bytes"] is None
    text = runner.invoke(app, ["fit", "tiny", "--profiles-dir", str(tmp_path)])
    assert "32 running x 1,024 rows" in text.stdout and "not known here (give --host)" in text.stdout


def test_bundled_profile_on_cuda_needs_a_card_and_is_judged_against_it(tmp_path):
    write(tmp_path, "gpu", f"""\
        runtime: bundled
        model: {{path: {CONFIGS / 'Qwen3-8B'}, served_name: q}}
        memory: {{context_length: 1024}}
        service: {{device: cuda}}
        """)
    bare = runner.invoke(app, ["fit", "gpu", "--profiles-dir", str(tmp_path)])
    assert bare.exit_code == 2 and "say which GPU" in bare.output and "CPU" not in bare.output
    small = runner.invoke(app, ["fit", "gpu", "--profiles-dir", str(tmp_path), "--gpu-mem-gib", "8"])
    assert small.exit_code == 1 and "does not fit" in small.stdout
    large = runner.invoke(app, ["fit", "gpu", "--profiles-dir", str(tmp_path), "--gpu-mem-gib", "80"])
    assert large.exit_code == 0 and "fits" in large.stdout


def test_validate_warns_when_a_profile_cannot_fit_its_hosts(tmp_path):
    write(tmp_path, "greedy", """\
        extends: a6000-balanced
        memory: {mem_fraction_static: 0.97}
        """)
    for name in ("a6000-base", "a6000-balanced"):
        write(tmp_path, name, (REPO / "profiles" / f"{name}.yaml").read_text())
    proc = subprocess.run([sys.executable, "-m", "ddops", "validate", "--json", "--profiles-dir", str(tmp_path),
                           "--inventory", str(REPO / "inventory.example.yaml"), "--models", str(CONFIGS)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr  # a warning, not a failure
    doc = json.loads(proc.stdout)
    def fit_warnings(name: str) -> list[str]:  # validate also warns about secrets; only fit matters here
        return [w for w in doc["profiles"][name]["warnings"] if "predicted not to fit" in w]
    assert fit_warnings("a6000-balanced") == []
    [warning] = fit_warnings("greedy")
    assert "predicted not to fit gpu-a6000-1 (2 x RTX A6000)" in warning and "headroom" in warning
