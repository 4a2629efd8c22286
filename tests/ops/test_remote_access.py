"""How ddops reaches a host, the parts that need no host: sudo wrapping (the password only on
stdin, the command's own stdin intact whether or not sudo read the password) and the merge of
the inventory with an ssh_config. The lab tests (tests/lab/test_lab_ops_bastion.py) run both
against real sudo, sshd and a bastion."""

from __future__ import annotations

import socket
import subprocess

import paramiko
import pytest

from ddops.inventory import Host
from ddops.remote.become import Become, BecomeError, become_of
from ddops.remote.connect import FAST_CIPHERS, preferring, recorded_keys
from ddops.remote.sshconfig import behind_ssh, endpoint
from ddops.deploy.tunnel import dialable


def test_root_commands_run_as_they_are_and_sudo_without_password_never_prompts():
    assert Become(None).wrap("systemctl restart x") == ("systemctl restart x", b"")
    assert Become("sudo").wrap("a; b") == ("sudo -n -- sh -c 'a; b'", b"")


@pytest.mark.parametrize("sudo_read_the_password", [True, False])
def test_the_password_goes_on_stdin_and_the_command_still_reads_its_own(sudo_read_the_password):
    command, stdin = Become("sudo", "s3cret pw").wrap("read line; echo got:$line")
    assert "s3cret" not in command and command.startswith("sudo -S -p '' -- sh -c ")
    assert stdin.startswith(b"s3cret pw\n")
    inner = command.removeprefix("sudo -S -p '' -- ")           # what sudo would exec
    fed = stdin.split(b"\n", 1)[1] if sudo_read_the_password else stdin
    out = subprocess.run(["sh", "-c", inner], input=fed + b"release\n", capture_output=True).stdout
    assert out == b"got:release\n"


def test_the_password_comes_from_the_named_env_var_or_file(tmp_path, monkeypatch):
    host = Host(name="h", address="10.0.0.1", become="sudo", become_password_env="H_SUDO")
    with pytest.raises(BecomeError, match="H_SUDO is not set"):
        become_of(host)
    monkeypatch.setenv("H_SUDO", "pw1")
    assert become_of(host).password == "pw1"
    (tmp_path / "pw").write_text("pw2\n")
    from_file = Host(name="h", address="10.0.0.1", become="sudo", become_password_file=tmp_path / "pw")
    assert become_of(from_file).password == "pw2"


def test_an_alias_of_the_ssh_config_with_proxyjump(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host bastion\n  HostName 192.0.2.5\n  User jump\n  Port 2200\n"
                      "Host gpu-1\n  HostName 10.0.0.11\n  User ops\n  IdentityFile ~/keys/ops\n"
                      "  ProxyJump bastion\n")
    where = endpoint(Host(name="gpu-1", address="gpu-1", ssh_config=config))
    assert (where.hostname, where.port, where.user) == ("10.0.0.11", 22, "ops")
    assert where.keys[0].endswith("/keys/ops")
    assert (where.jump.hostname, where.jump.port, where.jump.user) == ("192.0.2.5", 2200, "jump")
    stated = endpoint(Host(name="gpu-1", address="gpu-1", ssh_config=config, ssh_user="admin", ssh_port=2222))
    assert (stated.user, stated.port) == ("admin", 2222)        # the inventory wins where it speaks
    plain = endpoint(Host(name="x", address="10.9.9.9", ssh_config=config))
    assert (plain.hostname, plain.user, plain.jump) == ("10.9.9.9", "root", None)


def test_services_of_aliased_or_jumped_hosts_are_reached_through_ssh_and_others_directly(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu-1\n  HostName 10.0.0.11\n  ProxyJump bastion\nHost gpu-2\n  HostName 10.0.0.12\n")
    assert behind_ssh(Host(name="gpu-1", address="gpu-1", ssh_config=config))
    assert behind_ssh(Host(name="gpu-2", address="gpu-2", ssh_config=config))          # an alias: not dialable
    direct = Host(name="x", address="10.9.9.9", ssh_config=config)
    assert not behind_ssh(direct)
    with dialable(direct, "http://10.9.9.9:30000") as url:     # no SSH connection is opened for it
        assert url == "http://10.9.9.9:30000"
    this_machine = Host(name="me", address="127.0.0.1", ssh_config=config)
    with dialable(this_machine, "http://127.0.0.1:30000") as url:   # its loopback is ours
        assert url == "http://127.0.0.1:30000"


def test_gcm_is_offered_first_and_every_other_cipher_of_paramiko_still_follows():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        default = paramiko.Transport(ours).get_security_options().ciphers
        offered = preferring(FAST_CIPHERS)(ours).get_security_options().ciphers
        assert offered[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
        assert sorted(offered) == sorted(default)          # nothing dropped: old servers still negotiate
        unknown = preferring(("chacha20-poly1305@openssh.com", "aes256-gcm@openssh.com"))(ours)
        assert unknown.get_security_options().ciphers[0] == "aes256-gcm@openssh.com"   # one paramiko lacks is skipped
        assert preferring(())(ours).get_security_options().ciphers == default


def test_known_hosts_entries_are_found_plain_and_hashed_by_ssh_keygen(tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    key_type, key = (tmp_path / "k.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"10.1.2.3 {key_type} {key}\n[10.1.2.4]:2222 {key_type} {key}\n")
    assert recorded_keys(str(known), "10.1.2.3") == {(key_type, key)}
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    assert known.read_text().startswith("|1|") and "10.1.2.3" not in known.read_text()
    assert recorded_keys(str(known), "10.1.2.3") == {(key_type, key)}
    assert recorded_keys(str(known), "[10.1.2.4]:2222") == {(key_type, key)}
    assert recorded_keys(str(known), "10.1.2.4") == set() and recorded_keys(str(tmp_path / "absent"), "x") == set()
