"""The CLI shell (docs/ci.md): one exit-code table, one envelope for every JSON document, hints
that name commands which exist, and one reader of /server_info."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from ddops import exits
from ddops.cli import app
from ddops.shell import Envelope, envelope

REPO = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"`(ddops [^`]*)`")


def mentioned_commands() -> set[str]:
    """Every `ddops ...` a ddops source file can print (hints, errors, help texts)."""
    return {m for f in (REPO / "ddops").rglob("*.py") for m in COMMAND.findall(f.read_text())}


def is_group(command) -> bool:
    return hasattr(command, "commands")  # Typer ships its own click: duck-type the group


def resolve(words: list[str]):
    """Walk the command tree as far as the words name groups/commands; the rest are arguments."""
    command = typer.main.get_command(app)
    while words and is_group(command) and words[0] in command.commands:
        command, words = command.commands[words[0]], words[1:]
    return command, words


def test_every_command_a_hint_names_exists_with_its_options():
    ctx_options = {"--help"}
    missing = []
    for text in sorted(mentioned_commands()):
        for alternative in _alternatives(text.split()[1:]):
            command, rest = resolve(alternative)
            if is_group(command) and rest and not rest[0].startswith("-") \
                    and rest[0] not in ("...",) and not _placeholder(rest[0]):
                missing.append(f"{text}: no command {rest[0]!r}")
                continue
            known = {o for p in command.params for o in getattr(p, "opts", [])} | ctx_options
            missing += [f"{text}: no option {w}" for w in rest if w.startswith("-") and w.split("=")[0] not in known]
    assert missing == []
    assert len(mentioned_commands()) > 20  # the scan really reads the sources


def _alternatives(words: list[str]) -> list[list[str]]:
    """`status|logs` names two commands; `[--json]` an optional flag."""
    words = [w.strip("[]") for w in words if w != "|"]
    for i, word in enumerate(words):
        if "|" in word:
            return [[*words[:i], w, *words[i + 1:]] for w in word.split("|")]
    return [words]


def _placeholder(word: str) -> bool:
    return word.isupper() or word.startswith("{") or word.endswith(".yaml") or word == "..."


def test_a_hint_naming_a_missing_command_is_caught():
    command, rest = resolve(["profiles", "check"])
    assert command.name == "profiles" and rest == ["check"] and not is_group(command)


def test_one_exit_code_table_and_no_other_definitions():
    assert exits.MEANING[exits.BAD_INPUT] == "bad input" and len(set(exits.MEANING)) == len(exits.MEANING)
    defining = re.compile(r"^(EXIT_\w+|OK|BAD_INPUT|GATE_FAILED|NEEDS_OPERATOR|LOCK_HELD)\s*(,.*)?=\s*\d", re.M)
    others = [str(f.relative_to(REPO)) for f in (REPO / "ddops").rglob("*.py")
              if f.name != "exits.py" and defining.search(f.read_text())]
    assert others == []


def test_the_envelope_schema_in_docs_is_the_models():
    shipped = json.loads((REPO / "docs" / "cli-envelope.schema.json").read_text())
    assert shipped == Envelope.model_json_schema(), "regenerate: python -m ddops.shell > docs/cli-envelope.schema.json"


def test_envelope_puts_the_contract_first_and_validates():
    doc = envelope(exits.LOCKED, error="held", hint="wait", host="h1")
    assert list(doc)[:6] == ["schema_version", "ok", "exit_code", "meaning", "error", "hint"]
    assert doc["ok"] is False and doc["meaning"] == "lock held" and doc["host"] == "h1"
    Envelope.model_validate(doc)


def ddops(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-m", "ddops", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, **(env or {})})


DOCS = [  # (args, exit code): read-only commands whose --json needs no host
    (("profiles", "--json"), 0),
    (("show", "cpu-ddtree", "--json"), 0),
    (("validate", "--json", "--inventory", str(REPO / "inventory.example.yaml")), 0),
    (("validate", "nope", "--json"), 2),
    (("render", "cpu-ar", "--json"), 0),
    (("render", "nope", "--json"), 2),
    (("fit", "a6000-balanced", "--gpu", "a6000", "--json", "--models", str(REPO / "tests/fit/configs")), 0),
    (("fit", "a6000-base", "--gpu", "a6000", "--tp", "1", "--json", "--models", str(REPO / "tests/fit/configs")), 1),
    (("deploy", "nope", "--host", "h", "--json", "--yes"), 2),
    (("push-model", "/nonexistent", "--host", "nosuch", "--json", "-i", str(REPO / "inventory.example.yaml")), 2),
    (("preflight", "nope", "--json"), 2),
]


@pytest.mark.parametrize("args, code", DOCS, ids=[" ".join(a[:2]) for a, _ in DOCS])
def test_every_json_document_is_an_envelope_on_stdout(args, code):
    proc = ddops(*args)
    assert proc.returncode == code, proc.stderr
    doc = json.loads(proc.stdout)  # exactly one document, nothing else on stdout
    Envelope.model_validate(doc)
    assert doc["schema_version"] == 1 and doc["exit_code"] == code and doc["ok"] is (code == 0)
    assert "Traceback" not in proc.stderr


PLANTED_BUG = """
import sys, ddops.commands.profiles as profiles
def planted(*args, **kwargs):
    raise KeyError("planted-bug")
profiles.list_profiles = planted
from ddops.cli import main
sys.argv = ["ddops", *sys.argv[1:]]
main()
"""


def planted(*args: str) -> subprocess.CompletedProcess:
    """`ddops ARGS` with a KeyError planted where `ddops profiles` lists the profiles: a bug."""
    return subprocess.run([sys.executable, "-c", PLANTED_BUG, *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback():
    plain, debug = planted("profiles"), planted("--debug", "profiles")
    assert (plain.returncode, debug.returncode) == (exits.INTERNAL, exits.INTERNAL), plain.stderr
    assert "Traceback" not in plain.stderr and "KeyError: 'planted-bug'" in plain.stderr
    assert plain.stderr.strip().splitlines()[0].startswith("error: ")
    assert "Traceback" in debug.stderr and ", in planted\n" in debug.stderr  # the frame that raised


def test_a_bug_is_exit_70_never_the_gate_failed_code():
    from ddops.shell import classify
    code, hint, expected = classify(KeyError("x"))
    assert (code, expected) == (exits.INTERNAL, False) and "--debug" in hint
    assert classify(exits_error())[0] == exits.BAD_INPUT


def exits_error():
    from ddops.exits import BadInput
    return BadInput("bad")


def test_version_and_completion_are_global():
    assert ddops("--version").stdout.strip().startswith("ddops ")
    assert "--install-completion" in ddops("--help").stdout


@pytest.mark.parametrize("command", [(), ("deploy",), ("shadow", "start"), ("rollout",)])
def test_help_shows_a_switch_as_a_switch(command):
    """`--debug`, `--json`, `--yes` take no value, so their help names no type to give them."""
    shown = ddops(*command, "--help").stdout
    assert "--help" in shown and "<bool>" not in shown and "BOOLEAN" not in shown


def all_commands():
    def walk(command, path):
        if is_group(command):
            for name, sub in command.commands.items():
                yield from walk(sub, f"{path} {name}".strip())
        else:
            yield path, {o for p in command.params for o in getattr(p, "opts", [])}
    return list(walk(typer.main.get_command(app), ""))


def test_the_same_option_has_the_same_name_everywhere():
    found = all_commands()
    assert len(found) > 25
    assert [path for path, opts in found if "--inventory" in opts and "-i" not in opts] == []
    assert [path for path, opts in found if opts & {"--unit-name", "--unit_name"} and "--unit" not in opts] == []
    assert [path for path, opts in found if "--json-events" in opts and "--json" not in opts] == []
    assert [path for path, opts in found if "--json" in opts and "--json-events" not in opts] == []


@pytest.mark.parametrize("args, code", [(("validate", "cpu-ar"), 0), (("render", "nope"), 2)])
def test_json_events_ends_in_one_result_line_with_the_envelope(args, code):
    proc = ddops(*args, "--json-events")
    assert proc.returncode == code, proc.stderr
    [line] = proc.stdout.splitlines()
    event = json.loads(line)
    assert event.pop("event") == "result" and event["exit_code"] == code
    Envelope.model_validate(event)


def test_one_module_spells_systemctl_and_journalctl():
    spelled = re.compile(r"""["'f](systemctl|journalctl)\b""")
    # The mirror relay is a program of its own on production's host, uploaded alone and run by
    # the host's python3 (stdlib only): it cannot import ddops.systemd, so it spells its one
    # journalctl command itself (relay/source.py).
    relay = REPO / "ddops/rollout/shadow/relay"
    others = sorted(str(f.relative_to(REPO)) for f in (REPO / "ddops").rglob("*.py")
                    if f.name != "systemd.py" and relay not in f.parents and spelled.search(f.read_text()))
    assert others == []
