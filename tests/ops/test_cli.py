"""The CLI: `ddops profiles | show | validate | render`, through Typer's runner and,
for the exit-code contract, through the real `ddops` entry point in a subprocess."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import yaml
from typer.testing import CliRunner

from ddops.cli import app
from ddops.profile import list_profiles
from tests.ops.helpers import BASE, REPO, SHIPPED, write

runner = CliRunner()
DDOPS = [sys.executable, "-m", "ddops"]


def invoke(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env={"DDOPS_PROFILES": str(SHIPPED), **(env or {})})


def test_entry_point_renders_a6000_balanced_with_its_values():
    proc = subprocess.run([*DDOPS, "render", "a6000-balanced"], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for fragment in ("-m sglang.launch_server", "--mem-fraction-static 0.85", "--context-length 8192",
                     "--cuda-graph-backend-decode disabled", "--mamba-radix-cache-strategy extra_buffer",
                     "--speculative-algorithm DDTREE", "--speculative-ddtree-budget 16",
                     "--tp-size 2", "# ddops-profile: a6000-balanced", "--config /run/llm/api-key.yaml"):
        assert fragment in proc.stdout, fragment
    assert "# --- /etc/ddops/llm.env (mode 0600) ---" in proc.stdout


def test_entry_point_bad_profile_exits_2_with_one_line_per_problem(tmp_path):
    write(tmp_path, "bad", BASE + "memory:\n  mem_fraction_static: 1.5\nservice:\n  prot: 1\n")
    out_dir = tmp_path / "out"
    proc = subprocess.run([*DDOPS, "render", str(tmp_path / "bad.yaml"), "--out", str(out_dir)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("hint:"), proc.stderr
    assert any("memory.mem_fraction_static (line 6)" in line for line in lines)
    assert any("service.prot (line 8): unknown key (did you mean 'port'?)" in line for line in lines)
    assert "Traceback" not in proc.stderr
    assert not out_dir.exists()  # nothing rendered


def test_validate_all_shipped_profiles_passes():
    result = invoke("validate", "--json", env={"DDOPS_INVENTORY": str(REPO / "inventory.example.yaml")})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] and set(doc["profiles"]) == set(list_profiles(SHIPPED))
    assert doc["inventory"]["ok"] and doc["inventory"]["path"].endswith("inventory.example.yaml")


def test_validate_reports_bad_profiles_and_inventory(tmp_path):
    write(tmp_path, "good", BASE)
    write(tmp_path, "bad", "extends: missing\n")
    (tmp_path / "inv.yaml").write_text("hosts:\n  h:\n    adress: 10.0.0.1\n")
    result = invoke("validate", "--json", "--profiles-dir", str(tmp_path),
                    "--inventory", str(tmp_path / "inv.yaml"))
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["ok"] is False
    assert doc["profiles"]["good"] == {"ok": True, "problems": [], "warnings": []}
    assert "unknown parent profile 'missing'" in doc["profiles"]["bad"]["problems"][0]
    assert "hosts.h.adress (line 3): unknown key" in " ".join(doc["inventory"]["problems"])


def test_validate_table_names_each_profile():
    result = invoke("validate", "cpu-ar", "cpu-ddtree", env={"DDOPS_INVENTORY": ""})
    assert result.exit_code == 0, result.output
    assert "cpu-ar" in result.stdout and "cpu-ddtree" in result.stdout and "ok" in result.stdout


def test_profiles_lists_runtime_and_method():
    result = invoke("profiles", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)["profiles"]}
    assert rows["cpu-ddtree"]["method"] == "ddtree" and rows["cpu-ddtree"]["runtime"] == "bundled"
    assert rows["a6000-balanced"]["extends"] == "a6000-base"
    table = invoke("profiles")
    assert table.exit_code == 0 and "a6000-balanced" in table.stdout


def test_show_prints_resolved_yaml_with_sources():
    result = invoke("show", "a6000-balanced")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(l.strip().startswith("mem_fraction_static: 0.85") and l.endswith("a6000-balanced.yaml")
               for l in lines)
    assert any(l.strip().startswith("tp_size: 2") and l.endswith("a6000-base.yaml") for l in lines)
    assert any(l.strip().startswith("path: /health") and l.endswith("# default") for l in lines)
    resolved = yaml.safe_load(result.stdout)  # still YAML: the annotations are comments
    assert resolved["memory"]["mem_fraction_static"] == 0.85


def test_show_json_has_profile_and_sources():
    doc = json.loads(invoke("show", "cpu-ddtree", "--json").stdout)
    assert doc["profile"]["speculative"]["ddtree_budget"] == 16
    assert doc["sources"]["speculative.ddtree_budget"].endswith("cpu-ddtree.yaml")
    assert doc["sources"]["model.path"].endswith("cpu-ar.yaml")
    assert doc["sources"]["health.path"] == "default"


def test_render_json_and_overrides():
    result = invoke("render", "cpu-ddtree", "--json", "--unit-name", "llm-shadow", "--port", "30001")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["unit_path"] == "/etc/systemd/system/llm-shadow.service"
    assert doc["argv"][doc["argv"].index("--port") + 1] == "30001"
    assert doc["content_hash"] in doc["unit_text"]


def test_render_out_writes_unit_and_private_env_file(tmp_path):
    result = invoke("render", "cpu-ar", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "llm.service").read_text().startswith("# Rendered by ddops")
    assert stat.S_IMODE(os.stat(tmp_path / "llm.env").st_mode) == 0o600


def test_render_for_an_inventory_host(tmp_path):
    (tmp_path / "inv.yaml").write_text("hosts:\n  cpu-1:\n    address: 10.0.0.1\n")
    ok = invoke("render", "cpu-ar", "--host", "cpu-1", "--inventory", str(tmp_path / "inv.yaml"))
    assert ok.exit_code == 0, ok.output
    bad = invoke("render", "a6000-base", "--host", "cpu-1", "--inventory", str(tmp_path / "inv.yaml"))
    assert bad.exit_code == 2 and "needs a GPU" in bad.stderr
    missing = invoke("render", "cpu-ar", "--host", "nope", "--inventory", str(tmp_path / "inv.yaml"))
    assert missing.exit_code == 2 and "no such host (known: cpu-1)" in missing.stderr


def test_unknown_profile_exits_2():
    result = invoke("show", "cpu-ddtre")
    assert result.exit_code == 2 and "did you mean 'cpu-ddtree'?" in result.stderr


def test_validate_warns_where_a_valid_profile_exposes_the_service_or_its_key(tmp_path):
    write(tmp_path, "open", BASE + "service:\n  host: 0.0.0.0\n")
    write(tmp_path, "keyed", BASE + "service:\n  host: 0.0.0.0\n  secrets:\n    api_key_env: K\n")
    proc = subprocess.run([*DDOPS, "validate", "a6000-base", str(tmp_path / "open.yaml"),
                           str(tmp_path / "keyed.yaml")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert any("a6000-base" in w and "SGLang logs its server arguments, the API key included" in w
               for w in warnings), warnings
    assert any("open.yaml: service.host: 0.0.0.0 with no API key" in w for w in warnings), warnings
    assert not [w for w in warnings if "keyed" in w]
