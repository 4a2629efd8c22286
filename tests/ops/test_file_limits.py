"""Hostile files handed to ddops (profiles, inventories, rollout plans, prompt files) are refused
by the one bounded reader: a problem naming the file, exit 2, no traceback, and never the
gigabytes an alias bomb would expand to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddops.cli import app
from ddops.inventory import load_inventory
from ddops.profile import ConfigError, load_profile
from ddops.profile.yamlfile import MAX_BYTES, load_data
from ddops.rollout.shadow.prompts import PromptFileError, load_prompts
from ddops.rollout.fleet.waves import PlanError, load_plan

REPO = Path(__file__).resolve().parents[2]


def alias_bomb() -> bytes:
    """Nine levels of nine-fold aliases: under 500 bytes, 9**9 nodes expanded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return ("\n".join(lines) + "\n").encode()


HOSTILE = {
    "alias-bomb": (alias_bomb(), "aliases"),
    "deep-nesting": (b"a: " + b"[" * 20_000 + b"]" * 20_000 + b"\n", "nested deeper than 64"),
    "long-integer": (b"a: " + b"7" * 5_000 + b"\n", "integer longer than 40 digits"),
    "utf-16": ("a: 1\n".encode("utf-16"), "not UTF-8"),
    "latin-1": ("a: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    "huge": (b"a: " + b"x" * (MAX_BYTES + 10) + b"\n", "larger than 1 MiB"),
    "nul-byte": (b"a: b\x00c\n", "bad YAML"),
    "mapping-key": (b"? [a, b]\n: 1\n", "key"),
}


@pytest.fixture(params=sorted(HOSTILE))
def hostile(request, tmp_path) -> tuple[Path, str]:
    content, reason = HOSTILE[request.param]
    path = tmp_path / f"{request.param}.yaml"
    path.write_bytes(content)
    return path, reason


def test_the_alias_bomb_is_small_and_refused_by_its_expanded_size(tmp_path):
    assert len(alias_bomb()) < 500
    path = tmp_path / "bomb.yaml"
    path.write_bytes(alias_bomb())
    data, node, problems = load_data(path)
    assert data is None and node is None
    assert len(problems) == 1 and "expands to more than 100000 nodes through its aliases" in problems[0]


@pytest.mark.parametrize("loader,error", [
    (lambda p: load_profile(str(p)), ConfigError),
    (load_inventory, ConfigError),
    (load_plan, PlanError),
    (load_prompts, PromptFileError),
])
def test_every_reader_refuses_the_file_naming_it(hostile, loader, error):
    path, reason = hostile
    with pytest.raises(error) as caught:
        loader(path)
    message = str(caught.value)
    assert path.name in message and reason in message, message


def test_validate_exits_2_naming_the_file_without_a_traceback(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_bytes(alias_bomb())
    inventory = tmp_path / "inventory.yaml"
    inventory.write_bytes("hosts: {}\n".encode("utf-16"))
    for args in (["validate", str(bomb)], ["validate", "cpu-ar", "--inventory", str(inventory)]):
        done = subprocess.run([sys.executable, "-m", "ddops", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=60)
        named = bomb.name if str(bomb) in args else inventory.name
        assert done.returncode == 2, done.stdout + done.stderr
        assert named in done.stdout + done.stderr and "Traceback" not in done.stdout + done.stderr


def test_rollout_and_compare_exit_2_on_hostile_plan_and_prompt_files(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_bytes(HOSTILE["deep-nesting"][0])
    lines = tmp_path / "prompts.jsonl"
    lines.write_text('{"prompt": ' + "[" * 20_000 + "]" * 20_000 + "}\n")
    runner = CliRunner()
    plan = runner.invoke(app, ["rollout", str(deep), "--json"], input="")
    compare = runner.invoke(app, ["shadow", "compare", "--prompts", str(lines), "--production-url",
                                  "http://127.0.0.1:9", "--shadow-url", "http://127.0.0.1:9", "--json"],
                            input="")
    assert (plan.exit_code, compare.exit_code) == (2, 2), plan.output + compare.output
    assert deep.name in plan.output and lines.name in compare.output
    assert "Traceback" not in plan.output + compare.output
