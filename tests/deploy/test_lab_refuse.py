"""Knowable-bad changes cost no restart: on a real lab host running a production unit, each class
of definite problem stops deploy, rollback, switch and shadow start with exit 2 while the unit
file stays byte-identical and the service keeps its start timestamp. (--force, the gate failure
it then meets and its diagnosis: test_lab_deploy.py.)"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.deploy.models import tiny_pair, wide_draft
from tests.deploy.test_lab_deploy import HERE, MISMATCH, MISSING_MODEL, Site

pytestmark = pytest.mark.lab

UNIT, PORT = "ddrefuse.service", "30110"
TARGET = ("--unit", UNIT, "--port", PORT)
PROFILES = HERE / "profiles"
MODELS = "/var/lib/ddops/models"


class Production(Site):
    def deploy_json(self, profile: str, *extra: str, inventory: str | None = None) -> tuple[int, dict]:
        where = ("--inventory", inventory) if inventory else ()
        done = self.ddops("deploy", profile, "--host", self.name, *TARGET, "--yes", "--json", *where, *extra)
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)

    def unit_bytes(self) -> bytes | None:
        return self.remote.read(f"/etc/systemd/system/{UNIT}")

    def started(self) -> tuple[int, int, str]:
        out = self.remote.run(f"systemctl show {UNIT} -p ExecMainStartTimestampMonotonic -p NRestarts "
                              "-p ActiveState --value").stdout.split()
        return int(out[0]), int(out[1]), out[2]


@pytest.fixture(scope="module")
def prod(deploy_lab, cache_dir, tmp_path_factory):
    target, draft = tiny_pair(cache_dir)
    s = Production(deploy_lab, deploy_lab.hosts[0])
    for model in (target, draft, wide_draft(cache_dir)):
        assert s.ddops("push-model", str(model), "--host", s.name).returncode == 0
    s.remote.run(f"rm -rf {MODELS}/tiny-badlayer-dflash; cp -r {MODELS}/tiny-llama-dflash "
                 f"{MODELS}/tiny-badlayer-dflash && python3 -c \"import json; p='{MODELS}/tiny-badlayer-dflash/"
                 f"config.json'; c=json.load(open(p)); c['dflash_config']['target_layer_ids']=[1, 40]; "
                 f"json.dump(c, open(p, 'w'))\"")
    s.remote.run(f"systemctl disable --now {UNIT}; rm -rf /etc/systemd/system/{UNIT} /etc/ddops/ddrefuse.env "
                 f"/var/lib/ddops/history/{UNIT} /var/lib/ddops/deploy/{UNIT}; systemctl daemon-reload",
                 check=False)
    code, out = s.deploy_json("cpu-ar")
    assert code == 0, out
    s.small_gpu_inventory = str(_small_gpu_inventory(deploy_lab, s.name, tmp_path_factory.mktemp("inv")))
    yield s
    s.remote.run(f"systemctl disable --now {UNIT}", check=False)
    s.remote.close()


def _small_gpu_inventory(lab, name: str, folder):
    """The lab's inventory with this host declaring a 1 GB GPU (for the fit class)."""
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["hosts"][name]["gpu"] = {"kind": "tiny test GPU", "count": 1, "memory_gb": 1}
    path = folder / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


CLASSES = {
    "draft-target-width": (MISMATCH, "draft-target", "draft expects 192 = 2 layers x 96"),
    "draft-target-layers": (str(PROFILES / "cpu-ddtree-bad-layers.yaml"), "draft-target", "[40]"),
    "model-missing": (MISSING_MODEL, "model-missing", "not-pushed/config.json"),
    "draft-missing": (str(PROFILES / "cpu-ddtree-draft-missing.yaml"), "draft-missing", "not-pushed-draft"),
    "fit": (str(PROFILES / "sglang-tiny-nofit.yaml"), "fit", "predicted not to fit"),
    "unknown-flag": (str(PROFILES / "cpu-ar-unknown-flag.yaml"), "flag", "--tool-call-parser"),
}


@pytest.mark.parametrize("case", list(CLASSES))
def test_a_knowably_bad_deploy_exits_2_with_zero_restarts(prod, case):
    profile, check, words = CLASSES[case]
    before_bytes, before = prod.unit_bytes(), prod.started()
    inventory = prod.small_gpu_inventory if check == "fit" else None
    code, out = prod.deploy_json(profile, inventory=inventory)
    assert (code, out["result"]) == (2, "refused"), out
    found = [(r["check"], r["reason"]) for r in out["plan"]["refusals"]]
    assert any(c == check and words in reason for c, reason in found), found
    assert prod.unit_bytes() == before_bytes
    assert prod.started() == before and before[2] == "active"


def test_switch_and_shadow_start_refuse_before_stopping_anything(prod):
    before_bytes, before = prod.unit_bytes(), prod.started()
    switched = prod.ddops("switch", MISMATCH, "--host", prod.name, "--unit", UNIT, "--yes", "--json")
    assert switched.returncode == 2, switched.stdout + switched.stderr
    assert json.loads(switched.stdout)["status"] == "refused"
    shadow = prod.ddops("shadow", "start", MISMATCH, "--host", prod.name, "--production-unit", UNIT,
                        "--port", "30111", "--yes", "--json")
    assert shadow.returncode == 2, shadow.stdout + shadow.stderr
    assert not prod.remote.exists("/etc/systemd/system/ddrefuse-shadow.service")
    assert prod.unit_bytes() == before_bytes and prod.started() == before


def test_rollback_to_an_entry_whose_model_is_gone_is_refused(prod):
    # cpu-ddtree, not cpu-dflash: on the shipped smoke prompt the tiny target repeats " 202", which
    # the tiny draft's chain never guesses (accepted length 1.00, the gate rightly refuses); a tree does
    code, out = prod.deploy_json("cpu-ddtree")
    assert code == 0, out["message"]
    before_bytes, before = prod.unit_bytes(), prod.started()
    prod.remote.run(f"mv {MODELS}/tiny-llama {MODELS}/tiny-llama.away")
    try:
        back = prod.ddops("rollback", "--host", prod.name, "--unit", UNIT, "--yes", "--json")
    finally:
        prod.remote.run(f"mv {MODELS}/tiny-llama.away {MODELS}/tiny-llama")
    assert back.returncode == 2, back.stdout + back.stderr
    assert json.loads(back.stdout)["result"] == "refused"
    assert prod.unit_bytes() == before_bytes and prod.started() == before


def test_rollback_to_an_entry_predicted_not_to_fit_is_refused(prod):
    """The entry's profile still renders its unit, so its fit is predicted for the GPU the host
    declares now; a profile that no longer renders it leaves a note instead."""
    nofit = str(PROFILES / "sglang-tiny-nofit.yaml")
    code, out = prod.deploy_json(nofit, "--force", inventory=prod.small_gpu_inventory)   # no SGLang there:
    # it fails, is reverted and recorded
    assert (code, out["result"]) == (1, "reverted"), json.dumps(out)     # whole: once seen host-error, cause cut off
    entry = out["history_entry"]
    before_bytes, before = prod.unit_bytes(), prod.started()
    back = prod.ddops("rollback", "--host", prod.name, "--unit", UNIT, "--to", entry, "--yes", "--json",
                      "--inventory", prod.small_gpu_inventory, "--profiles-dir", str(PROFILES))
    assert back.returncode == 2, back.stdout + back.stderr
    found = {r["check"]: r["reason"] for r in json.loads(back.stdout)["plan"]["refusals"]}
    assert "predicted not to fit" in found.get("fit", ""), found
    assert prod.unit_bytes() == before_bytes and prod.started() == before
    elsewhere = prod.ddops("rollback", "--host", prod.name, "--unit", UNIT, "--to", entry, "--yes", "--json",
                           "--inventory", prod.small_gpu_inventory, "--profiles-dir", str(HERE))
    assert elsewhere.returncode == 2 and "fit" not in {r["check"] for r in json.loads(elsewhere.stdout)["plan"]["refusals"]}
    assert "fit not checked" in " ".join(json.loads(elsewhere.stdout)["notes"])
    assert prod.unit_bytes() == before_bytes and prod.started() == before


def test_a_rollout_host_refused_by_planning_is_forced_only_with_force(prod, tmp_path):
    profile = tmp_path / "ro-prod-missing.yaml"     # production's unit and port, a model the host lacks
    profile.write_text(yaml.safe_dump({"extends": "cpu-ar", "model": {"path": f"{MODELS}/not-pushed"},
                                       "service": {"unit": UNIT, "port": int(PORT)}}))
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"profile": str(profile), "hosts": [prod.name], "canary": 1, "max_failures": 0}))
    env = {"DDOPS_STATE": str(tmp_path / "state"), "DDOPS_PROFILES": str(HERE.parent.parent / "profiles")}
    before_bytes, before = prod.unit_bytes(), prod.started()
    refused = prod.ddops("rollout", str(plan), "--yes", "--json", env=env)
    doc = json.loads(refused.stdout)
    assert doc["hosts"][prod.name]["status"] == "refused" and "model-missing" in doc["hosts"][prod.name]["detail"]
    assert refused.returncode == 2, doc          # refused by planning, no host touched: bad input
    assert prod.unit_bytes() == before_bytes and prod.started() == before       # zero restarts
    forced = prod.ddops("rollout", str(plan), "--yes", "--json", "--restart", "--force", env=env)
    doc = json.loads(forced.stdout)
    assert forced.returncode == 1 and doc["hosts"][prod.name]["status"] == "failed", doc   # tried, gate failed
    newest = prod.remote.run(f"ls -d /var/lib/ddops/history/{UNIT}/*/ | tail -1").stdout.strip()
    meta = json.loads(prod.remote.read_text(f"{newest}meta.json"))
    assert meta["forced"][0]["check"] == "model-missing" and meta["result"] == "failed-reverted", meta
    assert prod.unit_bytes() == before_bytes and prod.started()[2] == "active"   # reverted byte for byte
