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


def test_one_shadow_at_a_time_except_the_rerun_of_an_interrupted_start():
    """Fast beside tests/rollout/test_lab_faults.py's killed starts: which start a record lets through."""
    import os
    import subprocess
    from dataclasses import replace

    import pytest

    from ddops.deploy.lock import Holder
    from ddops.exits import BadInput
    from ddops.rollout.shadow.lifecycle import refuse_unless_finishes, unfinished

    refuse_unless_finishes(None, "cpu-ar", "gpu-2")
    with pytest.raises(BadInput, match="already runs"):
        refuse_unless_finishes(RECORD, "cpu-ar", "gpu-2")
    dead = subprocess.Popen(["true"])
    dead.wait()
    killed = replace(RECORD, starting_by={**Holder.here("ddops shadow start cpu-ar --host gpu-2").as_dict(),
                                          "pid": dead.pid})
    refuse_unless_finishes(killed, "cpu-ar", "gpu-2")                 # its rerun finishes it
    with pytest.raises(BadInput, match="was interrupted; run it again"):
        refuse_unless_finishes(killed, "cpu-other", "gpu-2")
    assert "interrupted" in unfinished(killed) and unfinished(RECORD) is None
    live = replace(killed, starting_by={**killed.starting_by, "pid": os.getpid()})
    with pytest.raises(BadInput, match="under way"):
        refuse_unless_finishes(live, "cpu-ar", "gpu-2")
