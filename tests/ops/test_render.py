"""Rendering: golden units and env files for every shipped profile, and the properties the
deploy engine relies on (command line = profile, secrets only in the env file, a header it
can read back, a hash that tracks content).

Regenerate the goldens after an intended change:
    DDOPS_UPDATE_GOLDENS=1 .venv/bin/python -m pytest -q tests/ops/test_render.py
"""

from __future__ import annotations

import os
import re

import pytest

from ddops.inventory import Gpu, Host
from ddops.profile import list_profiles, load_profile
from ddops.render import RenderError, exec_start, key_config_path, read_header, render, resolve_secrets
from ddops.unitsyntax import exec_word
from tests.ops.helpers import BASE, REPO, SHIPPED, write

GOLDEN = REPO / "tests" / "ops" / "golden"
UPDATE = os.environ.get("DDOPS_UPDATE_GOLDENS") == "1"
SECRET = "sk-test-5f1e2d3c"


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"missing golden {path}; run with DDOPS_UPDATE_GOLDENS=1"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden"


@pytest.mark.parametrize("name", list_profiles(SHIPPED))
def test_golden_unit_and_env(name):
    rendered = render(load_profile(name, SHIPPED))
    _golden(f"{name}.service", rendered.unit_text)
    _golden(f"{name}.env", rendered.env_text)


def test_every_golden_belongs_to_a_shipped_profile():
    stems = {p.name.rsplit(".", 1)[0] for p in GOLDEN.iterdir()}
    assert stems == set(list_profiles(SHIPPED))


def _contract_flags() -> set[str]:
    """Flags the bundled runtime accepts, read from docs/contracts.md section 1."""
    text = (REPO / "docs" / "contracts.md").read_text()
    section = text.split("## 1.", 1)[1].split("## 2.", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `--")]
    return {flag for row in rows for flag in re.findall(r"--[a-z][a-z-]*", row)}


@pytest.mark.parametrize("name", [n for n in list_profiles(SHIPPED) if load_profile(n, SHIPPED).runtime == "bundled"])
def test_bundled_units_pass_only_contract_flags(name):
    rendered = render(load_profile(name, SHIPPED))
    assert rendered.argv[1:3] == ["-m", "serving"]
    used = {arg for arg in rendered.argv if arg.startswith("--")}
    assert used and used <= _contract_flags(), used - _contract_flags()


def test_a6000_balanced_command_line_carries_the_profile():
    argv = render(load_profile("a6000-balanced", SHIPPED)).argv
    pairs = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1) if argv[i].startswith("--")}
    assert argv[:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"]
    assert pairs["--mem-fraction-static"] == "0.85"
    assert pairs["--context-length"] == "8192"
    assert pairs["--tp-size"] == "2"
    assert pairs["--speculative-algorithm"] == "DDTREE"
    assert pairs["--speculative-draft-model-path"] == "/var/lib/ddops/models/Qwen3.6-27B-DFlash"
    assert pairs["--speculative-num-draft-tokens"] == "16"
    assert pairs["--speculative-ddtree-budget"] == "16"
    # sglang_version 0.5.23+ddtree: that release's spellings (ddops/profile/sglang_versions.py)
    assert pairs["--mamba-radix-cache-strategy"] == "extra_buffer"
    assert pairs["--mamba-ssm-dtype"] == "bfloat16"
    assert pairs["--cuda-graph-backend-decode"] == pairs["--cuda-graph-backend-prefill"] == "disabled"
    assert "--disable-cuda-graph" not in argv and not [a for a in argv if a.startswith("--cuda-graph-max-bs")]


def test_plain_decoding_passes_no_speculative_flags():
    argv = render(load_profile("cpu-ar", SHIPPED)).argv
    assert not [a for a in argv if a.startswith("--speculative")]


def test_secret_lands_only_in_the_env_file():
    for name in ("a6000-base", "cpu-ar"):
        profile = load_profile(name, SHIPPED)
        if not profile.service.secrets.has_api_key:
            continue
        rendered = render(profile, secrets={"DDOPS_API_KEY": SECRET})
        assert f"DDOPS_API_KEY={SECRET}\n" in rendered.env_text
        assert SECRET not in rendered.unit_text and SECRET not in " ".join(rendered.argv)
        assert "EnvironmentFile=/etc/ddops/llm.env" in rendered.unit_text


def test_sglang_gets_the_key_from_a_config_file_and_bundled_from_its_environment(tmp_path):
    sglang = render(load_profile("a6000-base", SHIPPED), secrets={"DDOPS_API_KEY": SECRET})
    assert sglang.argv[-2:] == ["--config", key_config_path("llm.service")] == ["--config", "/run/llm/api-key.yaml"]
    assert "--api-key" not in sglang.argv and "RuntimeDirectory=llm\n" in sglang.unit_text
    write(tmp_path, "p", BASE + "service:\n  secrets:\n    api_key_env: MY_KEY\n")
    bundled = render(load_profile("p", tmp_path), secrets={"DDOPS_API_KEY": SECRET})
    assert "--api-key" not in bundled.argv and f"DDOPS_API_KEY={SECRET}" in bundled.env_text


def test_hash_tracks_content_but_not_secret_values(tmp_path):
    profile = load_profile("a6000-base", SHIPPED)
    one = render(profile, secrets={"DDOPS_API_KEY": "one"})
    two = render(profile, secrets={"DDOPS_API_KEY": "two"})
    assert one.content_hash == two.content_hash == render(profile).content_hash
    other = render(load_profile("a6000-shadow", SHIPPED))
    assert other.content_hash != one.content_hash
    assert render(profile, port=30001).content_hash != one.content_hash


def test_header_reads_back_profile_and_hash():
    rendered = render(load_profile("cpu-ddtree", SHIPPED))
    header = read_header(rendered.unit_text)
    assert header["profile"] == "cpu-ddtree"
    assert header["hash"] == rendered.content_hash and len(header["hash"]) == 64
    assert header["version"]


def test_shadow_overrides_unit_name_and_port():
    rendered = render(load_profile("cpu-ddtree", SHIPPED), unit_name="llm-shadow", port=30001)
    assert rendered.unit_name == "llm-shadow.service"
    assert rendered.unit_path == "/etc/systemd/system/llm-shadow.service"
    assert rendered.env_path == "/etc/ddops/llm-shadow.env"
    assert "EnvironmentFile=/etc/ddops/llm-shadow.env" in rendered.unit_text
    assert "SyslogIdentifier=llm-shadow" in rendered.unit_text
    assert rendered.argv[rendered.argv.index("--port") + 1] == "30001"


def test_unit_is_written_the_way_an_operator_would():
    unit = render(load_profile("a6000-base", SHIPPED)).unit_text
    for line in ("Type=exec", "Restart=on-failure", "RestartSec=30", "TimeoutStartSec=1800",
                 "TimeoutStopSec=120", "LimitNOFILE=65536", "StandardOutput=journal",
                 "StartLimitBurst=3", "StartLimitIntervalSec=5490", "User=sglang",
                 "WorkingDirectory=/var/lib/sglang", "# ddops-profile: a6000-base"):
        assert f"\n{line}\n" in unit, line
    # StartLimitIntervalSec must cover burst x (load + restart delay) or the limit never trips
    assert "StartLimitIntervalSec" in unit.split("[Service]")[0]


def test_host_checks(tmp_path):
    cpu_host = Host(name="lab-1", address="10.0.0.1")
    one_gpu = Host(name="g1", address="10.0.0.2", gpu=Gpu(kind="RTX A6000", count=1, memory_gb=48))
    two_gpus = Host(name="g2", address="10.0.0.3", gpu=Gpu(kind="RTX A6000", count=2, memory_gb=48))
    profile = load_profile("a6000-base", SHIPPED)
    with pytest.raises(RenderError, match="needs a GPU"):
        render(profile, cpu_host)
    with pytest.raises(RenderError, match="tp_size 2, the host has 1"):
        render(profile, one_gpu)
    assert render(profile, two_gpus).unit_text == render(profile).unit_text
    assert render(load_profile("cpu-ar", SHIPPED), cpu_host).argv


def test_secrets_must_match_what_the_profile_declares(tmp_path):
    declared = load_profile("a6000-base", SHIPPED)
    with pytest.raises(RenderError, match="required by profile"):
        render(declared, secrets={})
    with pytest.raises(RenderError, match="contains a newline"):
        render(declared, secrets={"DDOPS_API_KEY": "a\nb"})
    with pytest.raises(RenderError, match="not declared"):
        render(load_profile(write(tmp_path, "nokey", BASE).stem, tmp_path), secrets={"DDOPS_API_KEY": SECRET})


def test_resolve_secrets_from_env_and_file(tmp_path):
    profile = load_profile("a6000-base", SHIPPED)
    assert resolve_secrets(profile, {"DDOPS_API_KEY": SECRET}) == {"DDOPS_API_KEY": SECRET}
    with pytest.raises(RenderError, match=r"\$DDOPS_API_KEY is not set"):
        resolve_secrets(profile, {})
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    write(tmp_path, "p", BASE + f"service:\n  secrets:\n    api_key_file: {key_file}\n")
    assert resolve_secrets(load_profile("p", tmp_path), {}) == {"DDOPS_API_KEY": SECRET}
    assert resolve_secrets(load_profile(write(tmp_path, "nokey", BASE).stem, tmp_path), {}) == {}


@pytest.mark.parametrize("arg,word", [
    ("/plain/path-1.0", "/plain/path-1.0"),
    ("/models/my model", '"/models/my model"'),
    ("50%", '"50%%"'),
    ("$HOME", '"$$HOME"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("", '""'),
])
def test_systemd_quoting_keeps_arguments_literal(arg, word):
    assert exec_word(arg) == word


def test_exec_start_puts_one_flag_per_line():
    text = exec_start(["/py", "-m", "serving", "--port", "1", "--disable-cuda-graph"])
    assert text == "/py -m serving \\\n    --port 1 \\\n    --disable-cuda-graph"


def test_environment_values_are_quoted_for_environmentfile(tmp_path):
    write(tmp_path, "p", BASE + "service:\n  environment:\n    GREETING: 'hello \"world\" $x'\n")
    env = render(load_profile("p", tmp_path)).env_text
    assert 'GREETING="hello \\"world\\" \\$x"\n' in env


def test_templates_are_strict(tmp_path, monkeypatch):
    for name in ("unit.service.j2", "sglang.service.j2", "env.j2"):
        (tmp_path / name).write_text((REPO / "templates" / name).read_text())
    (tmp_path / "bundled.service.j2").write_text("{{ no_such_variable }}\n")
    monkeypatch.setenv("DDOPS_TEMPLATES", str(tmp_path))
    with pytest.raises(Exception, match="no_such_variable"):
        render(load_profile("cpu-ar", SHIPPED))
