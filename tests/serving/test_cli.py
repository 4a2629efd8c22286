"""The runtime's command line: SGLang spellings, contradictions exit 2 naming the flag."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from serving.config import parse_args, resolve
from serving.models import read_model_config


def test_defaults_and_aliases(tiny_llama):
    args = parse_args(["--model-path", f"{tiny_llama}/", "--speculative-algorithm", "ddtree",
                       "--speculative-draft-model", "/d", "--speculative-dflash-block-size", "8"], environ={})
    assert args.served_model_name == tiny_llama.name
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 30000, None)
    assert args.speculative_draft_model_path == "/d" and args.speculative_num_draft_tokens == 8
    assert args.public()["speculative_algorithm"] == "DDTREE"


def test_api_key_from_environment_and_never_reported():
    args = parse_args(["--model-path", "m"], environ={"DDOPS_API_KEY": "s3cret"})
    assert args.api_key == "s3cret"
    assert "s3cret" not in json.dumps(args.public())
    assert parse_args(["--model-path", "m", "--api-key", "k"], environ={"DDOPS_API_KEY": "x"}).api_key == "k"


def test_resolve_fills_context_dtype_device(tiny_llama):
    config = read_model_config(tiny_llama)
    args = resolve(parse_args(["--model-path", str(tiny_llama)], environ={}), config, cuda_available=False)
    assert (args.device, args.dtype, args.context_length) == ("cpu", "float32", config.max_position_embeddings)
    on_gpu = resolve(parse_args(["--model-path", "m", "--context-length", "64"], environ={}), config, True)
    assert (on_gpu.device, on_gpu.dtype, on_gpu.context_length) == ("cuda", "float32", 64)
    with pytest.raises(ValueError, match="--device cuda"):
        resolve(parse_args(["--model-path", "m", "--device", "cuda"], environ={}), config, False)


@pytest.mark.parametrize("flags,named", [
    (["--bogus", "1"], "--bogus"),
    (["--speculative-draft-model-path", "/d"], "--speculative-draft-model-path"),
    (["--speculative-ddtree-budget", "4"], "--speculative-ddtree-budget"),
    (["--speculative-algorithm", "DFLASH"], "--speculative-draft-model-path"),
    (["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/d",
      "--speculative-ddtree-budget", "4"], "--speculative-ddtree-budget"),
    (["--speculative-algorithm", "EAGLE9"], "--speculative-algorithm"),
    (["--mem-fraction-static", "1.5"], "--mem-fraction-static"),
    (["--context-length", "0"], "--context-length"),
    (["--dtype", "int4"], "--dtype"),
])
def test_bad_flags_exit_2_naming_the_flag(flags, named, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--model-path", "m", *flags], environ={})
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err


def test_process_exits_2_on_unknown_flag():
    run = subprocess.run([sys.executable, "-m", "serving", "--model-path", "m", "--no-such-flag"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--no-such-flag" in run.stderr


def test_process_reports_a_broken_checkpoint_before_listening(tiny_llama, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_llama / "config.json").read_text())
    run = subprocess.run([sys.executable, "-m", "serving", "--model-path", str(broken), "--port", "1"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip() == f"error: {broken}: missing file model.safetensors " \
                                 f"(or model.safetensors.index.json for a sharded checkpoint)"


def test_eos_ids_come_from_config_generation_config_and_tokenizer(tiny_llama, tmp_path):
    import shutil

    from serving.models.tokenizer import Tokenizer
    from serving.server.startup import eos_ids

    model = shutil.copytree(tiny_llama, tmp_path / "m")
    config, tokenizer = read_model_config(model), Tokenizer.from_dir(model)
    assert eos_ids(model, config, tokenizer) == {2}                  # config.json and "<|im_end|>"
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert eos_ids(model, config, tokenizer) == {0, 2}


def test_sigterm_stops_the_server_cleanly(tiny_llama, tmp_path):
    from tests.server_process import ServerProcess

    server = ServerProcess(tiny_llama, tmp_path / "log", "--served-model-name", "tiny").wait_ready()
    server.process.terminate()
    # uvicorn shuts down gracefully, then re-raises SIGTERM: systemd counts that as a clean stop
    assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)
    log = (tmp_path / "log").read_text()
    assert "Application shutdown complete" in log and "Traceback" not in log


def test_max_total_tokens_on_a_speculative_hybrid_is_refused_at_start(tiny_llama, tmp_path):
    """A hybrid target with a speculative method is served one sequence at a time from its own
    cache, with no pool for --max-total-tokens to size: the process exits 2 before listening,
    with one line naming the flag and why. Where a pool takes it (a plain hybrid, a dense
    target with a method) the flag still resolves."""
    from serving.tools.tiny import write_tiny

    hybrid = write_tiny(tmp_path / "hybrid", "qwen3_5")
    spec = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(tmp_path / "draft")]
    run = subprocess.run([sys.executable, "-m", "serving", "--model-path", str(hybrid), *spec,
                          "--max-total-tokens", "500", "--port", "1"], capture_output=True, text=True, timeout=60)
    err = run.stderr.strip()
    assert run.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: argument --max-total-tokens: ") and "one sequence at a time" in err
    plain = parse_args(["--model-path", str(hybrid), "--max-total-tokens", "500"], environ={})
    assert resolve(plain, read_model_config(hybrid), False).max_total_tokens == 500
    dense = parse_args(["--model-path", str(tiny_llama), *spec, "--max-total-tokens", "500"], environ={})
    assert resolve(dense, read_model_config(tiny_llama), False).max_total_tokens == 500
