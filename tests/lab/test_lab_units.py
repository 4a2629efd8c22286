"""Pure parts of the lab and install code: names, addresses, sync plans, wheel identities, inventory shape."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.inventory import load_inventory
from ddops.install.bundled import missing_wheels
from ddops.install.sync import FAST_SHA256, one_packet_request, plan_sync, sha256_lines
from ddops.install.wheelhouse import Bundle, Wheelhouse, runtime_requirements, wheel_identity
from ddops.lab import inventory_file
from ddops.lab.errors import LabError
from ddops.lab.layout import HostSlot, LabLayout, host_names
from ddops.lab.rootfs import mirror_from_sources, stale_entries

REPO = Path(__file__).resolve().parents[2]


def layout(tmp_path: Path, prefix: str = "ddlab", subnet: str = "10.231.0") -> LabLayout:
    return LabLayout(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache", prefix=prefix, subnet=subnet)


def test_slots_get_distinct_fixed_addresses_macs_and_short_interface_names(tmp_path):
    lab = layout(tmp_path)
    slots = [HostSlot.of(lab, n) for n in host_names(80, bare=False) + host_names(80, bare=True)]
    assert len({s.address for s in slots}) == len({s.mac for s in slots}) == len({s.veth for s in slots}) == 160
    assert all(len(s.veth) <= 15 and s.netns.startswith("ddlab-") for s in slots)
    assert HostSlot.of(lab, "lab-1").address == "10.231.0.11"
    assert HostSlot.of(lab, "bare-2").address == "10.231.0.102" and HostSlot.of(lab, "bare-2").bare
    assert HostSlot.of(lab, "lab-3") == HostSlot.of(lab, "lab-3")   # same name, same plumbing, every run


def test_two_labs_never_share_names_or_addresses(tmp_path):
    mine, tests = layout(tmp_path), layout(tmp_path, prefix="ddtst", subnet="10.231.1")
    a, b = HostSlot.of(mine, "lab-1"), HostSlot.of(tests, "lab-1")
    assert {a.address, a.mac, a.netns, a.veth, mine.bridge}.isdisjoint({b.address, b.mac, b.netns, b.veth, tests.bridge})


@pytest.mark.parametrize("name", ["lab-0", "lab-81", "web-1", "lab-01", "lab-x"])
def test_bad_host_names_are_refused(tmp_path, name):
    with pytest.raises(LabError, match=name):
        HostSlot.of(layout(tmp_path), name)


@pytest.mark.parametrize("prefix,subnet,message", [("DD", "10.231.0", "DDOPS_LAB_PREFIX"),
                                                   ("ddlab", "8.8.8", "private"),
                                                   ("ddlab", "10.231", "DDOPS_LAB_SUBNET")])
def test_bad_lab_settings_name_the_variable(tmp_path, prefix, subnet, message):
    with pytest.raises(LabError, match=message):
        layout(tmp_path, prefix, subnet).validate()


def test_host_count_is_bounded(tmp_path):
    with pytest.raises(LabError, match="-n 0"):
        host_names(0, bare=False)


def test_mirror_comes_from_deb822_or_one_line_sources_and_skips_security():
    deb822 = "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\n" \
             "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n"
    assert mirror_from_sources([deb822]) == "http://mirror.example/debian"
    assert mirror_from_sources(["deb [arch=amd64] http://m.example/debian bookworm main\n"]) == "http://m.example/debian"
    assert mirror_from_sources(["# nothing\n"]) is None


def test_sync_plan_copies_changed_and_missing_files_and_skips_identical_ones():
    plan = plan_sync({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "x", "extra": "9"})
    assert plan.copy == ("b", "c") and plan.skip == ("a",)


@pytest.mark.parametrize("with_openssl", [True, False])
def test_host_sha256_reads_openssl_or_sha256sum_output_alike(tmp_path, with_openssl):
    """The snippet hosts run: OpenSSL's digest when installed, else coreutils' (a PATH without openssl)."""
    (tmp_path / "a b.bin").write_bytes(b"x" * 70000)
    (tmp_path / "c.json").write_text("{}")
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sha256sum", "xargs", "find") + (("openssl",) if with_openssl else ()):
        (tools / tool).symlink_to(shutil.which(tool))
    out = subprocess.run(["/bin/sh", "-c", FAST_SHA256 + "echo $h >&2; find . -type f -name '*.*' -print0 | xargs -0 $h"],
                         cwd=tmp_path, env={"PATH": str(tools)}, capture_output=True, text=True, check=True)
    assert out.stderr.strip() == ("openssl dgst -sha256 -r" if with_openssl else "sha256sum")
    assert sha256_lines(out.stdout) == {f"./{name}": hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
                                        for name in ("a b.bin", "c.json")}


def test_sftp_writes_fit_one_ssh_packet_of_the_server():
    assert one_packet_request(32768, 32768, 4) == 32768 - 64 - 25 - 4     # OpenSSH's 32 KiB packets
    assert one_packet_request(32768, 1 << 20, 4) == 32768                  # never above paramiko's size


def test_wheel_identity_normalizes_names_like_dist_info_dirs():
    assert wheel_identity(Path("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")) == ("torch", "2.13.0+cpu")
    assert wheel_identity(Path("Typing.Extensions-4.16.0-py3-none-any.whl")) == ("typing_extensions", "4.16.0")


def test_only_wheels_the_host_lacks_are_pushed(tmp_path):
    for name in ("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", "numpy-2.4.6-cp311-cp311-linux_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    bundle = Bundle(Wheelhouse(tmp_path, "k"), tmp_path / "ddops-0.1.0-py3-none-any.whl", "sha")
    missing = missing_wheels(bundle, {("torch", "2.13.0+cpu"), ("numpy", "1.0")})
    assert [w.name for w in missing] == ["numpy-2.4.6-cp311-cp311-linux_x86_64.whl"]


def test_runtime_requirements_hold_core_and_serving_deps_but_not_dev_tools():
    reqs = runtime_requirements(REPO / "pyproject.toml")
    assert "torch==2.13.0" in reqs and any(r.startswith("fabric") for r in reqs)
    assert not any(r.startswith("pytest") for r in reqs) and len(reqs) == len(set(reqs))


def test_written_inventory_loads_with_every_host_key_and_known_hosts(tmp_path, monkeypatch):
    monkeypatch.setenv("DDOPS_INVENTORY", str(tmp_path / "inv.yaml"))
    lab = layout(tmp_path)
    slots = [HostSlot.of(lab, "lab-1"), HostSlot.of(lab, "bare-1")]
    inventory_file.write(lab, slots)
    hosts = load_inventory(tmp_path / "inv.yaml").hosts
    assert list(hosts) == ["lab-1", "bare-1"]
    assert hosts["lab-1"].address == "10.231.0.11" and hosts["lab-1"].ssh_user == "root"
    assert hosts["bare-1"].known_hosts == lab.known_hosts and hosts["bare-1"].ssh_key == lab.client_key
    assert hosts["bare-1"].labels == {"lab": "ddlab", "runtime": "none"}
    inventory_file.remove(lab)
    assert not (tmp_path / "inv.yaml").exists()


def test_lab_down_never_removes_a_hand_written_inventory(tmp_path, monkeypatch):
    monkeypatch.setenv("DDOPS_INVENTORY", str(tmp_path / "inv.yaml"))
    (tmp_path / "inv.yaml").write_text("hosts: {}\n")
    inventory_file.remove(layout(tmp_path))
    assert (tmp_path / "inv.yaml").read_text() == "hosts: {}\n"


@pytest.mark.parametrize("env,args,message", [
    ({}, ["lab", "up", "-n", "0"], "-n 0"),
    ({"DDOPS_LAB_SUBNET": "8.8.8"}, ["lab", "status"], "DDOPS_LAB_SUBNET"),
    ({"DDOPS_LAB_PREFIX": "Bad-Prefix"}, ["lab", "down"], "DDOPS_LAB_PREFIX"),
])
def test_bad_lab_input_exits_2_with_one_line_before_touching_anything(tmp_path, env, args, message):
    state = tmp_path / "state"
    run_env = {**os.environ, "DDOPS_LAB_DIR": str(state), "DDOPS_LAB_PREFIX": "ddun", **env}
    proc = subprocess.run([sys.executable, "-m", "ddops", *args], cwd=REPO, env=run_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert not state.exists()


def test_cache_pruning_keeps_current_layers_and_trees_any_lab_boots_from():
    cache = Path("/cache/lab")
    entries = [cache / "base-b-1.tar.zst", cache / "runtime-base-b-1-old.tar.zst", cache / "runtime-base-b-1-new.tar.zst",
               cache / "trees/base-b-1", cache / "trees/runtime-base-b-1-old", cache / "trees/runtime-base-b-1-older",
               cache / "trees/.runtime-base-b-1-new.tmp42"]
    keep = {"base-b-1", "runtime-base-b-1-new"}
    stale = stale_entries(entries, keep, in_use={cache / "trees/runtime-base-b-1-old"})
    assert stale == [cache / "runtime-base-b-1-old.tar.zst", cache / "trees/runtime-base-b-1-older"]
