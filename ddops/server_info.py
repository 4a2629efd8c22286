"""The one reader of a serving endpoint's `/server_info`, in the fields SGLang and the bundled
runtime both report (docs/contracts.md section 2): the gate, `status`, shadow compare and the
demo all read it through here."""

from __future__ import annotations

import re

import httpx

# SGLang's /server_info returns its server arguments, secrets included: `api_key`,
# `admin_api_key` and `ssl_keyfile_password` in 0.5.15, at the top and again in every
# internal_states entry (docs/sglang.md "Gate"). They are
# dropped here, so no status, switch report or record ddops keeps can hold them.
SECRET_FIELD = re.compile(r"(^|_)(api_key|password|secret)$")


def read(client: httpx.Client, timeout: float = 30) -> dict | str:
    """/server_info as a dict without its secret fields, or a one-line reason it could not be read."""
    try:
        response = client.get("/server_info", timeout=timeout)
        info = response.json()
    except (httpx.HTTPError, ValueError) as err:
        return f"/server_info: {type(err).__name__}"
    if response.status_code != 200 or not isinstance(info, dict):
        return f"/server_info: HTTP {response.status_code}"
    return without_secrets(info)


def without_secrets(value):
    """The same JSON value with every secret field dropped, at any depth: SGLang repeats its
    server arguments in each internal_states entry."""
    if isinstance(value, dict):
        return {k: without_secrets(v) for k, v in value.items() if not SECRET_FIELD.search(str(k))}
    if isinstance(value, list):
        return [without_secrets(v) for v in value]
    return value


def read_or_empty(client: httpx.Client, timeout: float = 30) -> dict:
    info = read(client, timeout)
    return info if isinstance(info, dict) else {}


def _state(info: dict) -> dict:
    states = info.get("internal_states") or [{}]
    return states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}


def accept_length(info: dict) -> float | None:
    """internal_states[0].avg_spec_accept_length: mean tokens committed per verify round."""
    value = _state(info).get("avg_spec_accept_length")
    return float(value) if isinstance(value, (int, float)) else None


def accept_rounds(info: dict) -> int | None:
    """internal_states[0].spec_accept_rounds (bundled runtime): the rounds that figure rests on."""
    value = _state(info).get("spec_accept_rounds")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def throughput(info: dict) -> float | None:
    """internal_states[0].last_gen_throughput in tokens/s."""
    value = _state(info).get("last_gen_throughput")
    return float(value) if isinstance(value, (int, float)) else None
