"""Bad input to deploy/preflight/operate exits 2 with one JSON document or one line, before any
host is contacted (the inventory's host address is unroutable: a connection attempt would hang
or fail differently)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ddops(*args, inventory=None):
    env_args = ["--inventory", str(inventory)] if inventory else []
    return subprocess.run([sys.executable, "-m", "ddops", *args, *env_args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def inventory(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  far-1:\n    address: 192.0.2.1\n")   # TEST-NET-1: never answers
    return path


def test_unknown_profile_is_bad_input_naming_the_profile(tmp_path):
    done = ddops("deploy", "cpu-ddtre", "--host", "far-1", "--yes", "--json", inventory=inventory(tmp_path))
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert (doc["ok"], doc["exit_code"], doc["meaning"]) == (False, 2, "bad input")
    assert "cpu-ddtre" in doc["error"] and "did you mean 'cpu-ddtree'" in doc["error"]


def test_unknown_host_is_bad_input_naming_the_known_ones(tmp_path):
    done = ddops("deploy", "cpu-ar", "--host", "nowhere", "--yes", inventory=inventory(tmp_path))
    assert done.returncode == 2
    assert "nowhere" in done.stderr and "far-1" in done.stderr


def test_no_terminal_and_no_yes_refuses_before_connecting(tmp_path):
    done = ddops("deploy", "cpu-ar", "--host", "far-1", inventory=inventory(tmp_path))
    assert done.returncode == 2
    assert "refusing to deploy without --yes: no terminal to confirm on" in done.stderr
    assert "connecting" not in done.stdout


def test_status_needs_a_host_or_all():
    done = ddops("status")
    assert done.returncode == 2 and "--host NAME or --all" in done.stderr


def test_status_exits_6_when_a_host_cannot_be_reached_and_keeps_paramiko_quiet(tmp_path):
    """One host refuses the connection, one answers with a broken SSH banner and hangs up (paramiko
    logs its own 'Error reading SSH protocol banner' unless told not to)."""
    import socket
    import threading
    server = socket.create_server(("127.0.0.1", 0))

    def hang_up():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.0 400 not ssh\r\n")
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  closed:\n    address: 127.0.0.1\n    ssh_port: 1\n"
                    f"  garbled:\n    address: 127.0.0.1\n    ssh_port: {server.getsockname()[1]}\n")
    try:
        done = ddops("status", "--all", "--json", inventory=path)
        plain = ddops("status", "--all", inventory=path)
    finally:
        server.close()
    assert done.returncode == 6, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["exit_code"], doc["meaning"]) == (6, "host unreachable, nothing changed")
    assert [(r["host"], r["unreachable"]) for r in doc["units"]] == [("closed", True), ("garbled", True)]
    assert plain.returncode == 6 and "unreachable" in plain.stdout
    for out in (done.stderr, plain.stderr):
        assert "Traceback" not in out and "Exception" not in out and "paramiko" not in out, out


def test_deploy_port_out_of_range_is_bad_input_before_any_host(tmp_path):
    for port in ("0", "70000"):
        done = ddops("deploy", "cpu-ar", "--host", "far-1", "--port", port, "--yes", "--json",
                     inventory=inventory(tmp_path))
        assert done.returncode == 2
        assert f"--port {port}: not a TCP port (1-65535" in json.loads(done.stdout)["error"]
