"""Which shadow-compare endpoints go through their host's SSH connection: the recorded ones
whose host the inventory names (the lab test in tests/lab/test_lab_ops_bastion.py replays
through a bastion); explicit URLs, and hosts no inventory here names, are dialed as given."""

import yaml

from ddops.rollout.records import ShadowRecord
from ddops.rollout.shadow.lifecycle import _recorded_hosts

RECORD = ShadowRecord(profile="cpu-ar", host="gpu-2", unit="llm-shadow.service", port=30001,
                      url="http://gpu-2:30001", production_host="gpu-1", production_unit="llm.service",
                      production_url="http://gpu-1:30000", production_profile="cpu-ar", started=0.0)


def test_recorded_endpoints_map_to_inventory_hosts_and_explicit_urls_do_not(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"gpu-1": {"address": "gpu-1"}, "gpu-2": {"address": "gpu-2"}}}))
    both = _recorded_hosts(RECORD, None, None, inventory)
    assert {role: host.name for role, host in both.items()} == {"production": "gpu-1", "shadow": "gpu-2"}
    assert list(_recorded_hosts(RECORD, "http://127.0.0.1:1", None, inventory)) == ["shadow"]
    assert _recorded_hosts(RECORD, "http://a:1", "http://b:2", inventory) == {}
    assert _recorded_hosts(None, None, None, inventory) == {}


def test_hosts_no_inventory_names_are_dialed_directly(tmp_path):
    assert _recorded_hosts(RECORD, None, None, tmp_path / "absent.yaml") == {}
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"hosts": {"gpu-1": {"address": "gpu-1"}}}))
    assert list(_recorded_hosts(RECORD, None, None, other)) == ["production"]
