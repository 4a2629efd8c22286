"""vLLM profiles: what ddops renders is what the released vLLM 0.32 parser accepts, the version
table is that parser's own facts, and a setting vLLM has no meaning for is refused by name."""

from __future__ import annotations

import json
import subprocess

import pytest

from ddops.profile import list_profiles, load_profile
from ddops.profile.launch import read_launch
from ddops.render import render
from ddops.vllm.parser_facts import PROBE, parse
from ddops.vllm.versions import VersionError, facts_for, known_versions
from tests.ops.helpers import SHIPPED, problems_of, write
from tests.vllm_env import vllm_python

VLLM_PROFILES = [n for n in list_profiles(SHIPPED) if load_profile(n, SHIPPED).runtime == "vllm"]
SECRET = "sk-vllm-test-0c1d"

# Parses each command line with vLLM's own parser, as its api_server does; prints one JSON
# line per argv: the namespace values ddops relies on, or the parser's exit.
PARSE = r"""
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
for argv in json.loads(sys.stdin.read()):
    parser = make_arg_parser(FlexibleArgumentParser())
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exit:
        print(json.dumps({"exit": exit.code})); continue
    spec = ns.speculative_config
    print(json.dumps({"model": ns.model, "served": ns.served_model_name, "port": ns.port,
                      "max_model_len": ns.max_model_len, "enforce_eager": ns.enforce_eager,
                      "speculative": spec if isinstance(spec, dict) or spec is None else json.loads(spec),
                      "api_key": ns.api_key}))
"""


def _parse_with_vllm(argvs: list[list[str]]) -> list[dict]:
    done = subprocess.run([vllm_python(), "-c", PARSE], input=json.dumps(argvs), capture_output=True,
                          text=True, timeout=300, env={"VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_shipped_vllm_profiles_exist():
    assert {"cpu-smollm2-vllm", "cpu-smollm2-vllm-dflash", "a6000-vllm"} <= set(VLLM_PROFILES)


def test_vllm_parser_accepts_every_shipped_vllm_unit():
    rendered = [render(load_profile(n, SHIPPED), secrets={"VLLM_API_KEY": SECRET}) for n in VLLM_PROFILES]
    parsed = _parse_with_vllm([r.argv[3:] for r in rendered] + [["--no-such-flag", "1"]])
    assert parsed[-1] == {"exit": 2}      # the probe really refuses what vLLM does not know
    for name, r, ns in zip(VLLM_PROFILES, rendered, parsed):
        profile = load_profile(name, SHIPPED)
        assert r.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        assert ns["model"] == profile.model.path and ns["served"] == [profile.model.served_name], name
        assert ns["max_model_len"] == profile.memory.context_length
        assert ns["enforce_eager"] is (not profile.cuda_graph.enabled)
        assert ns["api_key"] is None and SECRET not in r.unit_text and SECRET not in " ".join(r.argv)
        assert f"VLLM_API_KEY={SECRET}" in r.env_text.splitlines()
        if profile.method.is_speculative:
            assert ns["speculative"] == {"method": "dflash", "model": profile.speculative.draft_model_path,
                                         "num_speculative_tokens": profile.speculative.block_size - 1}
        else:
            assert ns["speculative"] is None


def test_version_table_is_the_wheels_own_parser():
    done = subprocess.run([vllm_python(), "-c", PROBE], capture_output=True, text=True, timeout=300,
                          env={"VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"})
    live = parse(done.stdout)
    assert live == facts_for(live.version.split("+")[0])
    assert "dflash" in live.methods and "--speculative-config" in live.flags


def test_unit_reads_back_as_the_profile():
    for name in VLLM_PROFILES:
        profile = load_profile(name, SHIPPED)
        launch = read_launch(render(profile).argv)
        assert launch.runtime == "vllm" and launch.get("model.path") == profile.model.path
        assert launch.int("service.port") == profile.service.port
        if profile.method.is_speculative:
            assert launch.method == "dflash"
            assert launch.get("speculative.draft_model_path") == profile.speculative.draft_model_path
            assert launch.int("speculative.block_size") == profile.speculative.block_size


VLLM_BASE = """\
runtime: vllm
model:
  path: /m/target
  served_name: t
"""


@pytest.mark.parametrize("extra, key, words", [
    ("speculative:\n  algorithm: ddtree\n  draft_model_path: /m/d\n  block_size: 8\n",
     "speculative.algorithm", "cannot serve method ddtree (it serves: dflash)"),
    ("speculative:\n  algorithm: dflash\n  draft_model_path: /m/d\n  block_size: 8\n  ddtree_budget: 8\n",
     "speculative.ddtree_budget", "runtime vllm has no flag"),
    ("speculative:\n  algorithm: dflash\n  draft_model_path: /m/d\n", "speculative.block_size",
     "required by runtime vllm"),
    ("mamba:\n  ssm_dtype: bfloat16\n", "mamba.ssm_dtype", "runtime vllm has no flag"),
    ("service:\n  enable_metrics: false\n", "service.enable_metrics", "runtime vllm has no flag"),
    ("memory:\n  kv_cache_dtype: bf16\n", "memory.kv_cache_dtype", "not 'bf16'"),
    ("memory:\n  chunked_prefill_size: -1\n", "memory.chunked_prefill_size", "no --max-num-batched-tokens"),
    ("vllm:\n  extra_args: [--no-such-flag, '1']\n", "vllm.extra_args", "--no-such-flag is not a vLLM 0.32.0 flag"),
    ("vllm:\n  extra_args: [--api-key, k]\n", "vllm.extra_args", "rendered by ddops from service.secrets"),
    ("sglang:\n  extra_args: [--tool-call-parser, x]\n", "sglang.extra_args", "appends vllm.extra_args"),
    ("sglang_version: 0.5.23\n", "sglang_version", "set, but runtime is vllm"),
    ("vllm_version: 0.9.1\n", "vllm_version", "not in ddops's table"),
    ("service:\n  environment:\n    VLLM_API_KEY: k\n", "service.environment.VLLM_API_KEY", "reserved"),
])
def test_setting_vllm_cannot_take_is_refused_by_name(tmp_path, extra, key, words):
    write(tmp_path, "p", VLLM_BASE + extra)
    found = problems_of(tmp_path, "p")
    assert any(key in line and words in line for line in found), found


def test_valid_vllm_profile_has_no_problems(tmp_path):
    write(tmp_path, "p", VLLM_BASE + "vllm_version: 0.32.0\nvllm:\n  extra_args: [--block-size, '32']\n")
    profile = load_profile("p", tmp_path)
    assert render(profile).argv[-2:] == ["--block-size", "32"]


def test_version_table_places_releases():
    assert known_versions()[-1] == "0.32.0"
    assert facts_for("0.32.0+cpu").version == "0.32.0"
    with pytest.raises(VersionError):
        facts_for("latest")
