"""Values that become units are data: a random value in any rendered field reads back unchanged
by systemd's rules, or the profile is refused naming the field; systemd's own parser accepts
units carrying such values; a key made of every printable character reaches the runtime (env
file) and SGLang (--config file written by ExecStartPre) as itself.

The lab test tests/deploy/test_lab_hardening.py checks these readers against a real systemd."""

from __future__ import annotations

import os
import random
import string
import subprocess

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ddops.profile import load_profile
from ddops.render import render
from ddops.unitsyntax import env_value, exec_word, parse_env, setting_value, split_exec
from tests.ops.helpers import SHIPPED
from tests.ops.roundtrip import FIELDS, SPECIALS, check, random_value, verify_sample

PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
values = st.text(st.one_of(st.sampled_from(SPECIALS), st.characters(blacklist_categories=("Cs",))),
                 min_size=1, max_size=40)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(field=st.sampled_from(FIELDS), value=values)
def test_every_rendered_value_reads_back_unchanged_or_is_refused_naming_its_key(field, value):
    assert check(field, value) in ("same", "refused")


@pytest.mark.parametrize("field", FIELDS)
def test_refusal_is_for_control_characters_not_for_quotes_or_specifiers(field):
    assert check(field, "data/it's 50% \"$HOME\" `x` \\ ; # ok") == "same"
    assert check(field, "data\nExecStartPre=/bin/sh -c id") == "refused"
    assert check(field, "data\x1b[31m") == "refused"


def test_systemd_analyze_verify_accepts_units_carrying_random_values():
    rng = random.Random(16)
    units, complaints = verify_sample([random_value(rng) for _ in range(40)])
    assert units >= 10 and complaints == []


@pytest.mark.parametrize("line,value", [
    ('K="a\\"b\\\\c\\$d\\`e"', 'a"b\\c$d`e'),     # the four escapes systemd undoes in "..."
    ('K="a\\nb"', "a\\nb"),                        # any other backslash is kept
    ("K='a\"b\\c'", 'a"b\\c'),                     # single quotes are literal
    ("K=  plain value  ", "plain value"),          # blanks around a plain value are dropped
    ("K=a\\ b", "a b"),                            # outside quotes a backslash escapes one char
    ('K="a" "b"', "ab"),                           # parts join, blanks between them dropped
    ('K=a"b"', 'a"b"'),                            # a quote inside a plain value is a character
])
def test_env_reader_follows_systemds_rules(line, value):
    assert parse_env(f"# comment\n; comment\n{line}\n") == {"K": value}


@pytest.mark.parametrize("raw,argv", [
    ('/bin/x "a b" c', ["/bin/x", "a b", "c"]),
    ('/bin/x "say \\"hi\\"" "back\\\\slash"', ["/bin/x", 'say "hi"', "back\\slash"]),
    ('/bin/x "50%%" "$$HOME" ${KEEP}', ["/bin/x", "50%", "$HOME", "${KEEP}"]),
])
def test_exec_reader_follows_systemds_rules(raw, argv):
    assert split_exec(raw) == argv
    assert split_exec(" ".join(exec_word(arg) for arg in argv[:2])) == argv[:2]


def test_a_key_of_every_printable_character_reads_back_from_the_env_file():
    for key in [PRINTABLE, *PRINTABLE, " lead", "trail ", string.punctuation * 2]:
        assert parse_env(f"DDOPS_API_KEY={env_value(key)}\n") == {"DDOPS_API_KEY": key}, key


def test_sglang_reads_the_key_its_execstartpre_wrote(tmp_path):
    """Runs the rendered ExecStartPre= as systemd would (argv from the unit, key in the
    environment), then reads the file the way SGLang's --config does (yaml.safe_load, then
    `--api-key str(value)`)."""
    rendered = render(load_profile("a6000-base", SHIPPED), secrets={"DDOPS_API_KEY": PRINTABLE})
    argv = split_exec(setting_value(rendered.unit_text, "ExecStartPre"))
    target = tmp_path / "api-key.yaml"
    assert argv[-1] == rendered.argv[-1] == "/run/llm/api-key.yaml"
    env = {"PATH": os.environ["PATH"], **parse_env(rendered.env_text)}
    for key in (PRINTABLE, "123", "1e3", "null", "yes", "'quoted'", "- item", "{a: b}"):
        env["DDOPS_API_KEY"] = key
        subprocess.run(["python3", *argv[1:-1], str(target)], env=env, check=True, timeout=30)
        assert oct(target.stat().st_mode & 0o777) == "0o600"
        assert str(yaml.safe_load(target.read_text())["api-key"]) == key
    assert PRINTABLE not in rendered.unit_text and "--api-key" not in rendered.argv
