"""Hardening on a real lab host (issue 16): what systemd hands a process is exactly what ddops
wrote, the bundled unit's sandbox scores below 5.0 in `systemd-analyze security` with the gate
still passing, and an API key made of awkward characters appears in no journal line, history
entry, argv, unit file or ddops output after a deploy, a failed deploy and a rollback."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.remote import connect
from ddops.unitsyntax import env_value, exec_word, unsafe_text
from tests.deploy.models import tiny_pair
from tests.ops.roundtrip import random_value

pytestmark = pytest.mark.lab

HERE = Path(__file__).parent
MISSING_MODEL = str(HERE / "profiles" / "cpu-ar-missing-model.yaml")
LOOPBACK = str(HERE / "profiles" / "cpu-ar-loopback.yaml")
UNIT, PORT = "ddharden.service", "30200"
TARGET = ("--unit", UNIT, "--port", PORT)
KEY = "sk-hard $`\"\\'#%;{x}=" + os.urandom(4).hex()
PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
# Prints what the process received: argv after the script, and the environment it was given.
DUMP = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
        "if k.startswith('PROBE_')}}, open('/run/ddops-probe.json', 'w'))")


@pytest.fixture(scope="module")
def host(deploy_lab, cache_dir):
    host = deploy_lab.host(deploy_lab.hosts[-1])
    for model in tiny_pair(cache_dir):
        pushed = deploy_lab.ddops("push-model", str(model), "--host", host.name)
        assert pushed.returncode == 0, pushed.stderr
    with connect(host) as remote:
        remote.run(f"systemctl disable --now {UNIT}; rm -rf /etc/systemd/system/{UNIT} "
                   f"/var/lib/ddops/history/{UNIT} /var/lib/ddops/deploy/{UNIT}; systemctl daemon-reload",
                   check=False)
        yield deploy_lab, host, remote
        remote.run(f"systemctl disable --now {UNIT}", check=False)


def ddops(lab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddops", *args], cwd=HERE.parent.parent,
                          env={**os.environ, **lab.env, "DDOPS_API_KEY": KEY}, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


def test_systemd_passes_exactly_the_words_and_environment_ddops_writes(host):
    _, _, remote = host
    rng = random.Random(16)
    words = [v for v in (random_value(rng) for _ in range(300)) if not unsafe_text(v)][:120]
    env = {f"PROBE_{i}": v for i, v in enumerate([PRINTABLE, *PRINTABLE, " lead", "trail ", *words[:40]])}
    remote.write("/etc/ddops/probe.env", "".join(f"{k}={env_value(v)}\n" for k, v in env.items()), mode=0o600)
    remote.write("/etc/systemd/system/ddops-probe.service", "[Service]\nType=oneshot\n"
                 "EnvironmentFile=/etc/ddops/probe.env\n"
                 f"ExecStart={' '.join(exec_word(w) for w in ['/usr/bin/python3', '-c', DUMP, *words])}\n")
    remote.run("rm -f /run/ddops-probe.json; systemctl daemon-reload; systemctl start ddops-probe.service")
    seen = json.loads(remote.read_text("/run/ddops-probe.json"))
    remote.run("rm -f /etc/systemd/system/ddops-probe.service /etc/ddops/probe.env; systemctl daemon-reload")
    assert len(words) >= 100
    assert seen == {"argv": words, "env": env}


def test_the_bundled_unit_is_sandboxed_below_exposure_5_and_passes_the_gate(host):
    lab, machine, remote = host
    deployed = ddops(lab, "deploy", "cpu-ar", "--host", machine.name, *TARGET, "--yes", "--json")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert json.loads(deployed.stdout)["gate"]["passed"]
    report = remote.run(f"systemd-analyze security --no-pager {UNIT}").stdout
    exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", report).group(1))
    assert exposure < 5.0, report
    pid = remote.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    assert remote.run(f"ps -o user= -p {pid}").stdout.strip() == "ddops"


def test_the_key_is_nowhere_after_deploy_failed_deploy_and_rollback(host):
    lab, machine, remote = host
    # the missing model is knowable, so deploy would refuse it (exit 2, nothing touched): --force
    # makes it a real failed deploy, gated and reverted
    deploys = [ddops(lab, "deploy", profile, "--host", machine.name, *TARGET, "--yes", "--json", *force)
               for profile, force in (("cpu-ar", ()), (LOOPBACK, ()), (MISSING_MODEL, ("--force",)))]
    assert [done.returncode for done in deploys] == [0, 0, 1], [d.stdout + d.stderr for d in deploys]
    entries = json.loads(ddops(lab, "history", "--host", machine.name, "--unit", UNIT, "--json").stdout)["entries"]
    first = next(e["id"] for e in entries if (e["profile"], e["result"]) == ("cpu-ar", "passed"))
    # the entry keeps a fingerprint only: the key comes back from the host's env file, and the
    # rolled-back service (a restart: cpu-ar-loopback runs now) passes its keyed gate with it
    back = ddops(lab, "rollback", "--host", machine.name, "--unit", UNIT, "--to", first, "--yes", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    assert "# ddops-profile: cpu-ar" in remote.read_text(f"/etc/systemd/system/{UNIT}")
    outputs = [*deploys, back, ddops(lab, "status", "--host", machine.name, "--unit", UNIT, "--json"),
               ddops(lab, "logs", "--host", machine.name, "--unit", UNIT, "-n", "500")]
    assert all(KEY not in done.stdout + done.stderr for done in outputs)
    places = {"journal": "journalctl --no-pager -o cat", "argv": "ps -eo args",
              "history": f"cat /var/lib/ddops/history/{UNIT}/*/*", "units": f"cat /etc/systemd/system/{UNIT}"}
    for place, command in places.items():
        assert KEY not in remote.run(command).stdout, place
    assert env_value(KEY) in remote.read_text(f"/etc/ddops/{UNIT.removesuffix('.service')}.env")
    assert "sha256:" in remote.run(f"cat /var/lib/ddops/history/{UNIT}/*/meta.json").stdout
