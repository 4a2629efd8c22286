"""History keeps a fingerprint of each secret, never the secret; a rollback puts back the key
the host's env file holds now. (The lab test test_lab_hardening.py runs this on a host.)"""

from __future__ import annotations

import pytest

from ddops.deploy.history import SecretMissing, fingerprint, restore_secrets, withhold_secrets
from ddops.profile import load_profile
from ddops.render import render
from tests.ops.helpers import SHIPPED

KEY = "sk-$`\"\\' #%;-history"


def env_with(key: str) -> str:
    return render(load_profile("cpu-ar", SHIPPED), secrets={"DDOPS_API_KEY": key}).env_text


def test_history_env_holds_the_fingerprint_and_not_the_key():
    kept, prints = withhold_secrets(env_with(KEY))
    assert prints == {"DDOPS_API_KEY": fingerprint(KEY)} and KEY not in kept
    assert f"# DDOPS_API_KEY=<withheld, {fingerprint(KEY)}>" in kept.splitlines()
    assert "OMP_NUM_THREADS=1" in kept.splitlines()     # the rest of the file is kept as it was
    assert fingerprint(KEY) != fingerprint(KEY + "x") and KEY not in fingerprint(KEY)


def test_rollback_restores_the_file_byte_for_byte_with_the_hosts_key():
    original = env_with(KEY)
    kept, _ = withhold_secrets(original)
    assert restore_secrets(kept, original) == original


def test_a_rotated_key_stays_rotated_and_a_missing_one_is_refused():
    kept, _ = withhold_secrets(env_with(KEY))
    assert restore_secrets(kept, env_with("sk-new")) == env_with("sk-new")
    with pytest.raises(SecretMissing, match="not in the host's env file"):
        restore_secrets(kept, None)


def test_an_env_file_without_secrets_passes_through():
    text = render(load_profile("cpu-ar", SHIPPED), secrets={"DDOPS_API_KEY": "k"}).env_text
    plain = "\n".join(line for line in text.splitlines() if "DDOPS_API_KEY" not in line) + "\n"
    assert withhold_secrets(plain) == (plain, {}) and restore_secrets(plain, None) == plain


def test_a_rollback_across_runtimes_takes_the_key_under_the_variable_the_unit_has_now():
    bundled = env_with(KEY)
    vllm = render(load_profile("cpu-smollm2-vllm", SHIPPED), secrets={"VLLM_API_KEY": KEY}).env_text
    kept, _ = withhold_secrets(bundled)
    assert restore_secrets(kept, vllm) == bundled           # bundled entry, vLLM running now
    kept_vllm, prints = withhold_secrets(vllm)
    assert prints == {"VLLM_API_KEY": fingerprint(KEY)} and KEY not in kept_vllm
    assert restore_secrets(kept_vllm, bundled) == vllm      # and back
