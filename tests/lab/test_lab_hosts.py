"""Lab hosts from the session fixture: real containers, real sshd, real systemd, via ddops.remote."""

import hashlib
import json
import subprocess
import uuid

import pytest

from ddops import exits
from ddops.remote import RemoteError, connect

pytestmark = pytest.mark.lab


def test_each_host_answers_ssh_at_its_own_address_with_systemd_running(lab_hosts):
    names = set()
    for name in lab_hosts.hosts:
        host = lab_hosts.host(name)
        with connect(host) as remote:
            assert remote.run("systemctl is-system-running", check=False).stdout.strip() in ("running", "degraded")
            assert f"inet {host.address}/24" in remote.run("ip -4 -o addr show dev eth0").stdout
            names.add(remote.run("hostname").stdout.strip())
            assert remote.run("ps -p 1 -o comm=").stdout.strip() == "systemd"
            transport = remote.connection.transport     # GCM offered first (bulk pushes cost less CPU)
            assert (transport.local_cipher, transport.remote_cipher) == ("aes128-gcm@openssh.com",) * 2
    assert names == set(lab_hosts.hosts)


def test_a_host_presenting_another_key_is_refused(lab_hosts, tmp_path):
    host = lab_hosts.host(lab_hosts.hosts[0])
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    key_type, key = (tmp_path / "other.pub").read_text().split()[:2]
    (tmp_path / "known_hosts").write_text(f"{host.address} {key_type} {key}\n")
    with pytest.raises(RemoteError, match="host key does not match"):
        connect(host.model_copy(update={"known_hosts": tmp_path / "known_hosts"}))


def test_a_host_missing_from_known_hosts_is_refused(lab_hosts, tmp_path):
    (tmp_path / "known_hosts").write_text("")
    host = lab_hosts.host(lab_hosts.hosts[0])
    with pytest.raises(RemoteError, match="not found in known_hosts"):
        connect(host.model_copy(update={"known_hosts": tmp_path / "known_hosts"}))


def test_lab_up_again_keeps_the_running_hosts(lab_hosts):
    before = json.loads(lab_hosts.ddops("lab", "status", "--json").stdout)["hosts"]
    known_hosts = lab_hosts.host(lab_hosts.hosts[0]).known_hosts.read_text()
    again = lab_hosts.ddops("lab", "up", "-n", str(len(lab_hosts.hosts)))
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    after = json.loads(lab_hosts.ddops("lab", "status", "--json").stdout)["hosts"]
    assert [(h["host"], h["pid"]) for h in after] == [(h["host"], h["pid"]) for h in before]
    assert lab_hosts.host(lab_hosts.hosts[0]).known_hosts.read_text() == known_hosts


def test_lab_status_shows_every_host_running_at_its_inventory_address(lab_hosts):
    status = lab_hosts.ddops("lab", "status", "--json")
    assert status.returncode == 0, status.stderr
    rows = {row["host"]: row for row in json.loads(status.stdout)["hosts"]}
    for name in lab_hosts.hosts:
        assert rows[name]["state"] == "running" and rows[name]["runtime"] == "bundled"
        assert rows[name]["address"] == lab_hosts.host(name).address and rows[name]["pid"] > 0
    table = lab_hosts.ddops("lab", "status").stdout
    assert all(name in table for name in lab_hosts.hosts)


def test_runtime_from_lab_up_runs_the_current_serving_package(lab_hosts):
    with connect(lab_hosts.host(lab_hosts.hosts[-1])) as remote:
        help_text = remote.run("/opt/ddops/venv/bin/python -m serving --help", timeout=120).stdout
        assert "--model-path" in help_text
        remote.run("/opt/ddops/venv/bin/python -c 'import ddops.lab, serving'")


def test_write_replaces_files_atomically_with_the_given_mode(lab_hosts):
    path = f"/etc/ddops-test/{uuid.uuid4().hex}/secret.env"
    with connect(lab_hosts.host(lab_hosts.hosts[0])) as remote:
        assert remote.read(path) is None and not remote.exists(path)
        remote.write(path, "A=1\n", mode=0o600)
        remote.write(path, "A=2\n", mode=0o600)
        assert remote.read_text(path) == "A=2\n"
        assert remote.run(f"stat -c %a {path}").stdout.strip() == "600"
        leftovers = remote.run(f"ls -A $(dirname {path})").stdout.split()
        assert leftovers == ["secret.env"]


def test_run_reports_exit_codes_and_names_the_failure(lab_hosts):
    with connect(lab_hosts.host(lab_hosts.hosts[0])) as remote:
        assert remote.run("exit 3", check=False).exit_code == 3
        with pytest.raises(RemoteError, match=r"exited 1: .*no-such-file"):
            remote.run("cat /no-such-file")
        assert remote.run("echo ok").stdout == "ok\n"


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_push_model_copies_changed_files_then_skips_unchanged_ones(lab_hosts, tmp_path):
    model = tmp_path / "tiny-model"
    (model / "sub").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    (model / "config.json").write_text('{"hidden_size": 8}\n')
    (model / "sub" / "tokenizer.json").write_text("{}\n")
    dest = f"/var/lib/ddops/models/test-{uuid.uuid4().hex[:8]}"
    name = lab_hosts.hosts[0]
    shown = lab_hosts.ddops("push-model", str(model), "--host", name, "--dest", dest, "--dry-run")
    assert shown.returncode == 0 and "would copy 3 file(s)" in shown.stdout, shown.stdout + shown.stderr
    with connect(lab_hosts.host(name)) as remote:
        assert remote.read_text(f"{dest}/config.json") is None and not remote.run(f"ls -d {dest}", check=False).stdout
    first = lab_hosts.ddops("push-model", str(model), "--host", name, "--dest", dest)
    assert first.returncode == 0, first.stderr
    assert "copied 3 file(s)" in first.stdout and "skipped 0" in first.stdout
    second = lab_hosts.ddops("push-model", str(model), "--host", name, "--dest", dest)
    assert "copied 0 file(s)" in second.stdout and "skipped 3 unchanged" in second.stdout
    (model / "config.json").write_text('{"hidden_size": 16}\n')
    shown = lab_hosts.ddops("push-model", str(model), "--host", name, "--dest", dest, "--dry-run")
    assert "would copy 1 file(s) (0.0 MB): config.json; 2 already there" in shown.stdout, shown.stdout
    third = lab_hosts.ddops("push-model", str(model), "--host", name, "--dest", dest)
    assert "copied 1 file(s)" in third.stdout and "skipped 2 unchanged" in third.stdout
    with connect(lab_hosts.host(name)) as remote:
        sums = remote.run(f"cd {dest} && sha256sum model.safetensors config.json sub/tokenizer.json").stdout
        assert sums.split()[::2] == [sha256(model / f) for f in ("model.safetensors", "config.json", "sub/tokenizer.json")]


def test_push_model_removes_temp_files_a_killed_push_left(lab_hosts, tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "w.bin").write_bytes(b"x" * 1000)
    dest = f"/var/lib/ddops/models/test-{uuid.uuid4().hex[:8]}"
    with connect(lab_hosts.host(lab_hosts.hosts[0])) as remote:
        remote.run(f"mkdir -p {dest} && head -c 10 /dev/zero > {dest}/.w.bin.ddops-tmp-deadbeef")
    pushed = lab_hosts.ddops("push-model", str(model), "--host", lab_hosts.hosts[0], "--dest", dest)
    assert pushed.returncode == 0, pushed.stderr
    with connect(lab_hosts.host(lab_hosts.hosts[0])) as remote:
        assert remote.run(f"ls -A {dest}").stdout.split() == ["w.bin"]


def test_bad_push_model_input_is_one_line_and_touches_nothing(lab_hosts, tmp_path):
    missing = lab_hosts.ddops("push-model", str(tmp_path / "absent"), "--host", lab_hosts.hosts[0])
    assert missing.returncode == exits.BAD_INPUT and missing.stderr.strip().count("\n") == 0 and "not a directory" in missing.stderr
    unknown = lab_hosts.ddops("push-model", str(tmp_path), "--host", "nosuchhost")
    assert unknown.returncode != 0 and "nosuchhost" in unknown.stderr


def test_missing_key_or_known_hosts_file_is_named_before_connecting(lab_hosts, tmp_path):
    host = lab_hosts.host(lab_hosts.hosts[0])
    with pytest.raises(RemoteError, match="ssh key .*absent: no such file"):
        connect(host.model_copy(update={"ssh_key": tmp_path / "absent"}))
    with pytest.raises(RemoteError, match="known_hosts .*absent: no such file"):
        connect(host.model_copy(update={"known_hosts": tmp_path / "absent"}))
