"""Inventory: hosts, defaults, label selection, where it is found, and its errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddops.inventory import InventoryError, find_inventory, load_inventory

INVENTORY = """\
defaults:
  ssh_user: ops
  known_hosts: keys/known_hosts
  labels: {site: a}
hosts:
  gpu-1:
    address: 10.0.0.11
    ssh_key: keys/id_ed25519
    gpu: {kind: RTX A6000, count: 2, memory_gb: 48}
    labels: {role: prod}
  gpu-2:
    address: 10.0.0.12
    ssh_user: root
    labels: {role: shadow, site: b}
"""


def write(folder: Path, text: str, name: str = "inventory.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_hosts_get_defaults_and_their_own_values(tmp_path):
    inventory = load_inventory(write(tmp_path, INVENTORY))
    one, two = inventory.hosts["gpu-1"], inventory.hosts["gpu-2"]
    assert (one.name, one.address, one.ssh_port, one.ssh_user) == ("gpu-1", "10.0.0.11", 22, "ops")
    assert two.ssh_user == "root"
    assert one.gpu.kind == "RTX A6000" and one.gpu.count == 2 and one.gpu.memory_gb == 48
    assert two.gpu is None
    assert one.labels == {"site": "a", "role": "prod"} and two.labels == {"site": "b", "role": "shadow"}


def test_relative_key_paths_are_relative_to_the_inventory_file(tmp_path):
    inventory = load_inventory(write(tmp_path, INVENTORY))
    assert inventory.hosts["gpu-1"].ssh_key == tmp_path / "keys/id_ed25519"
    assert inventory.hosts["gpu-2"].known_hosts == tmp_path / "keys/known_hosts"
    assert inventory.hosts["gpu-2"].ssh_key is None


def test_select_by_labels(tmp_path):
    inventory = load_inventory(write(tmp_path, INVENTORY))
    assert [h.name for h in inventory.select({"role": "prod"})] == ["gpu-1"]
    assert [h.name for h in inventory.select({"site": "b", "role": "shadow"})] == ["gpu-2"]
    assert [h.name for h in inventory.select({})] == ["gpu-1", "gpu-2"]
    assert inventory.select({"role": "canary"}) == []


def test_unknown_host_names_the_known_ones(tmp_path):
    inventory = load_inventory(write(tmp_path, INVENTORY))
    with pytest.raises(InventoryError) as caught:
        inventory.host("gpu-9")
    assert "hosts.gpu-9: no such host (known: gpu-1, gpu-2)" in caught.value.problems[0]


def test_the_example_inventory_is_valid(repo_root):
    inventory = load_inventory(repo_root / "inventory.example.yaml")
    assert inventory.select({"role": "prod"})


@pytest.mark.parametrize("text,expected", [
    ("hosts:\n  h:\n    address: 10.0.0.1\n    ssh_prot: 22\n",
     "hosts.h.ssh_prot (line 4): unknown key (did you mean 'ssh_port'?)"),
    ("hosts:\n  h:\n    address: 10.0.0.1\n    ssh_port: 99999\n", "hosts.h.ssh_port (line 4):"),
    ("hosts:\n  h:\n    ssh_port: 22\n", "hosts.h.address (line 2): required key is missing"),
    ("hosts:\n  h:\n    address: 10.0.0.1\n    gpu: {kind: A6000, count: 0, memory_gb: 48}\n",
     "hosts.h.gpu.count (line 4):"),
    ("defaults:\n  ssh_port: nope\nhosts:\n  h:\n    address: 10.0.0.1\n",
     "defaults.ssh_port (line 2): input should be a valid integer"),
    ("hostz: {}\n", "hostz (line 1): unknown key"),
    ("hosts:\n  h: [1, 2]\n", "hosts.h (line 2): must be a mapping"),
    ("hosts:\n  h:\n    address: 10.0.0.1\n  h:\n    address: 10.0.0.2\n",
     "hosts.h (line 4): duplicate key"),
])
def test_errors_name_file_key_and_line(tmp_path, text, expected):
    with pytest.raises(InventoryError) as caught:
        load_inventory(write(tmp_path, text))
    assert len(caught.value.problems) == 1, caught.value.problems
    assert caught.value.problems[0].startswith(str(tmp_path / "inventory.yaml")) or \
        caught.value.problems[0].split(":")[0].endswith("inventory.yaml")
    assert expected in caught.value.problems[0], caught.value.problems


def test_resolution_order(tmp_path, monkeypatch):
    lab = tmp_path / "lab"
    lab.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("DDOPS_INVENTORY", raising=False)
    monkeypatch.setenv("DDOPS_LAB_DIR", str(lab))
    monkeypatch.setattr("ddops.inventory.REPO_LAB_INVENTORY", tmp_path / "absent.yaml")
    assert find_inventory() is None
    write(lab, INVENTORY)
    assert find_inventory() == lab / "inventory.yaml"
    write(work, INVENTORY)
    assert find_inventory() == Path("inventory.yaml")
    monkeypatch.setenv("DDOPS_INVENTORY", str(tmp_path / "env.yaml"))
    assert find_inventory() == tmp_path / "env.yaml"
    assert find_inventory(tmp_path / "explicit.yaml") == tmp_path / "explicit.yaml"


def test_no_inventory_anywhere_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DDOPS_INVENTORY", raising=False)
    monkeypatch.setenv("DDOPS_LAB_DIR", str(tmp_path / "none"))
    monkeypatch.setattr("ddops.inventory.REPO_LAB_INVENTORY", tmp_path / "absent.yaml")
    with pytest.raises(InventoryError) as caught:
        load_inventory()
    assert "ddops lab up" in caught.value.problems[0]


def test_lab_written_shape_loads(tmp_path):
    # the shape `ddops lab up` writes: absolute key paths, gpu: null
    text = ("hosts:\n  lab-1:\n    address: 10.77.0.11\n    ssh_port: 22\n    ssh_user: root\n"
            f"    ssh_key: {tmp_path}/id\n    known_hosts: {tmp_path}/kh\n    gpu: null\n"
            "    labels: {lab: ddl, runtime: bundled}\n")
    host = load_inventory(write(tmp_path, text)).host("lab-1")
    assert host.ssh_key == tmp_path / "id" and host.gpu is None
