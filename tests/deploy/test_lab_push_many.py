"""push-model to several lab hosts at once: per-host progress, a partial upload resumed, a corrupt
one caught by the sha256 check on the host (and the next push succeeding)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddops.remote import connect
from tests.deploy.models import tiny_pair
from tests.deploy.test_lab_deploy import HERE

pytestmark = pytest.mark.lab
DEST = "/var/lib/ddops/models/push-many-test"


def push(lab, model, *where: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddops", "push-model", str(model), *where, "--dest", DEST],
                          cwd=HERE.parent.parent, env={**os.environ, **lab.env}, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)


def test_parallel_push_resumes_a_partial_upload_and_rejects_a_corrupt_one(deploy_lab, cache_dir):
    model, _ = tiny_pair(cache_dir)
    weights = (model / "model.safetensors").read_bytes()
    sha = hashlib.sha256(weights).hexdigest()
    first, second = deploy_lab.hosts[:2]
    half = len(weights) // 2
    part = f"{DEST}/.model.safetensors.ddops-part-{sha[:16]}"
    for name, head in ((first, weights[:half]), (second, b"\0" * half)):   # second: wrong bytes
        with connect(deploy_lab.host(name)) as remote:
            remote.run(f"rm -rf {DEST}")
            remote.write(part, head)
    done = push(deploy_lab, model, "--hosts", f"{first},{second}")
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"{first}:{DEST}: copied" in done.stdout
    assert f"{second}: FAILED" in done.stdout and "sha256 after upload" in done.stdout
    again = push(deploy_lab, model, "--selector", f"lab={deploy_lab.host(first).labels['lab']}")
    assert again.returncode == 0, again.stdout + again.stderr
    for name in (first, second):
        with connect(deploy_lab.host(name)) as remote:
            assert remote.run(f"sha256sum {DEST}/model.safetensors").stdout.split()[0] == sha
            assert remote.run(f"ls -A {DEST} | grep -c ddops-part || true").stdout.strip() == "0"
            remote.run(f"rm -rf {DEST}")


def test_files_in_nested_folders_land_where_they_were(deploy_lab, tmp_path):
    """Every subfolder a push needs is made on the host (in one command) before the files go."""
    local = tmp_path / "nested-model"
    files = {"config.json": b"{}", "tokenizer/vocab.json": b'{"a": 1}', "tokenizer/extra/merges.txt": b"a b\n",
             "weights/shard-1.bin": os.urandom(4096)}
    for rel, data in files.items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(data)
    name = deploy_lab.hosts[0]
    done = push(deploy_lab, local, "--host", name)
    assert done.returncode == 0, done.stdout + done.stderr
    with connect(deploy_lab.host(name)) as remote:
        try:
            for rel, data in files.items():
                assert remote.read(f"{DEST}/{rel}") == data
        finally:
            remote.run(f"rm -rf {DEST}")


def test_a_push_killed_midway_leaves_no_process_behind(deploy_lab, tmp_path):
    """kill -9 of push-model while a worker uploads: its fork server and workers die with it
    (ddops/install/bound.py), and the resource tracker ends once they are gone."""
    import signal
    import time
    import uuid

    local = tmp_path / "big-model"
    local.mkdir()
    (local / "model.safetensors").write_bytes(os.urandom(1 << 26))       # 64 MiB: long enough to kill midway
    name, mark = deploy_lab.hosts[0], uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "ddops", "push-model", str(local), "--host", name, "--dest", DEST],
                            cwd=HERE.parent.parent, env={**os.environ, **deploy_lab.env, "DDOPS_TEST_MARK": mark},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    with connect(deploy_lab.host(name)) as remote:
        remote.run(f"rm -rf {DEST}")
        deadline = time.monotonic() + 60
        while "ddops-part" not in remote.run(f"ls -A {DEST} 2>/dev/null; true").stdout:   # a worker uploads
            assert time.monotonic() < deadline and proc.poll() is None, "the push never started uploading"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(3)
        assert marked(mark) == [], "processes of the killed push still run"
        remote.run(f"rm -rf {DEST}")


def marked(mark: str) -> list[int]:
    """Processes of this machine whose environment carries `mark`."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"DDOPS_TEST_MARK={mark}".encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found
