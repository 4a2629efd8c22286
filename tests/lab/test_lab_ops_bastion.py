"""A fleet reached the way real ones are: `ddops lab up --bastion` gives the hosts a non-root
`ops` user whose sudo asks for a password, reachable only through a bastion (ProxyJump), and
named by Host aliases of an ssh_config. Deploy, rollback and a 2-host rollout go through it.

Its own lab (prefix and /24 derived from the session's lab, tests/fixtures_lab.py session_lab, +10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ddops.inventory import Host, load_inventory
from ddops.remote import RemoteError, connect
from tests.fixtures_lab import Lab, ddops, lab_env, lab_skip_reason, session_lab
from tests.rollout.lab_models import build

pytestmark = pytest.mark.lab
UNIT, PORT = "ddops-ops.service", "30130"
SHORT_CONTEXT = "extends: cpu-ar\nmemory: {context_length: 512}\n"


@pytest.fixture(scope="module")
def ops_lab(cache_dir, tmp_path_factory) -> Lab:
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    lab, subnet = session_lab()
    env = lab_env(lab[:7] + "b", str(subnet + 10))
    up = ddops(env, "lab", "up", "-n", "2", "--bastion", timeout=1800)
    if up.returncode != 0:
        ddops(env, "lab", "down")
        pytest.fail(f"lab up --bastion failed:\n{up.stdout}\n{up.stderr}")
    lab = Lab(Path(env["DDOPS_INVENTORY"]), ("lab-1", "lab-2"), env)
    model = build(cache_dir)["tiny-llama"]
    for host in lab.hosts:
        pushed = lab.ddops("push-model", str(model), "--host", host)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    yield lab
    down = ddops(env, "lab", "down")
    assert down.returncode == 0, down.stdout + down.stderr


def deploy(lab: Lab, profile: str, host: str = "lab-1") -> tuple[int, dict]:
    done = lab.ddops("deploy", profile, "--host", host, "--unit", UNIT, "--port", PORT, "--yes", "--json")
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_hosts_are_reached_as_ops_through_the_bastion_and_act_as_root(ops_lab):
    inventory = load_inventory(ops_lab.inventory)
    host = inventory.hosts["lab-1"]
    assert host.address == "lab-1" and host.become == "sudo"   # an ssh_config alias; User ops comes from there
    with connect(host) as remote:
        assert remote.connection.user == "ops" and remote.connection.gateway is not None
        assert remote.run("id -u").stdout.strip() == "0"                 # through sudo
        assert remote.run("printf %s \"$SUDO_USER\"").stdout == "ops"
    direct = Host(name="lab-1", address=f"{ops_lab.env['DDOPS_LAB_SUBNET']}.11", ssh_user="ops",
                  ssh_key=host.known_hosts.parent / "id_ed25519", known_hosts=host.known_hosts)
    with pytest.raises(RemoteError):                                      # no way in without the bastion
        connect(direct).close()


def test_the_sudo_password_never_reaches_argv_or_output(ops_lab):
    password = (ops_lab.inventory.parent / "ops-sudo-password").read_text().strip()
    host = load_inventory(ops_lab.inventory).hosts["lab-1"]
    with connect(host) as remote:
        seen = remote.run("ps -eo args; journalctl -n 200 --no-pager -o cat").stdout
    assert password not in seen


def test_deploy_and_rollback_as_ops_through_the_bastion(ops_lab, tmp_path):
    code, out = deploy(ops_lab, "cpu-ar")
    assert code == 0, out
    short = tmp_path / "cpu-ar-short.yaml"
    short.write_text(SHORT_CONTEXT)
    code, out = deploy(ops_lab, str(short))
    assert code == 0, out
    host = load_inventory(ops_lab.inventory).hosts["lab-1"]
    with connect(host) as remote:
        modes = remote.run(f"stat -c '%a %U' /etc/systemd/system/{UNIT} /etc/ddops/ddops-ops.env").stdout.split("\n")
        assert modes[:2] == ["644 root", "600 root"]
        before = remote.read(f"/etc/systemd/system/{UNIT}")
    back = ops_lab.ddops("rollback", "--host", "lab-1", "--unit", UNIT, "--yes", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    with connect(host) as remote:
        after = remote.read(f"/etc/systemd/system/{UNIT}")
    assert after != before and b"# ddops-profile: cpu-ar\n" in after


def test_a_watched_two_host_rollout_and_a_shadow_compare_through_the_bastion(ops_lab, tmp_path):
    """The bake's /metrics scrapes and probes, and the shadow replay, reach hosts named by
    ssh_config aliases only through SSH tunnels (these names do not resolve here)."""
    analysis = {"interval_s": 1, "min_requests": 2, "probe": {"rate_per_s": 4, "max_tokens": 2},
                "checks": [{"metric": "error_ratio", "max": 0.0}]}
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": ["lab-1", "lab-2"], "canary": 1, "wave_size": 1,
                                    "bake_s": 4, "analysis": analysis}))
    done = ops_lab.ddops("rollout", str(plan), "--yes", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert {h: s["status"] for h, s in doc["hosts"].items()} == {"lab-1": "done", "lab-2": "done"}
    for name in ("lab-1", "lab-2"):
        watched = doc["analysis"][name]
        assert watched["verdict"]["status"] == "passed", watched
        assert max(s["window"]["requests"] for s in watched["samples"] if "window" in s) >= 2
        status = json.loads(ops_lab.ddops("status", "--host", name, "--unit", "llm.service", "--json").stdout)
        assert status["units"][0]["health"] == "200", status
    state = {"DDOPS_STATE": str(tmp_path / "state")}
    loose = tmp_path / "cpu-ar-loose.yaml"     # equality judges; speed on 2 shared cores is noise
    loose.write_text("extends: cpu-ar\nrollout: {min_token_equality: 1.0, max_p95_latency_regression: 50.0, "
                     "min_tokens_per_s_ratio: 0.01}\n")
    started = ddops({**ops_lab.env, **state}, "shadow", "start", str(loose), "--host", "lab-2",
                    "--production-host", "lab-1", "--yes", "--json")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        compared = ddops({**ops_lab.env, **state}, "shadow", "compare", "--count", "2", "--max-tokens", "4", "--json")
        assert compared.returncode == 0, compared.stdout + compared.stderr
        result = json.loads(compared.stdout)
        assert result["comparison"]["prompts_equal"] == 2 and result["shadow_url"].startswith("http://lab-2:")
    finally:
        ddops({**ops_lab.env, **state}, "shadow", "abort", "--yes", "--json")
