"""One lab host serving a peer runtime (vLLM, SGLang) under a test unit of its own: deploy as
JSON, the unit's bytes and start, and a chat from outside the host."""

from __future__ import annotations

import json

import httpx

from tests.conftest import TEST_API_KEY
from tests.deploy.test_lab_deploy import Site

SERVED = "smollm2-135m-instruct"


def told(out: dict) -> str:
    """A failed deploy's own words first: pytest's repr of the whole dict cuts them off."""
    return "\n".join([out.get("message", ""), *map(str, out.get("diagnosis") or []), json.dumps(out)[:3000]])


def peer_site(lab, cache_dir, runtime: str, unit: str, port: str):
    """The lab's last host with RUNTIME installed and SmolLM2 pushed, no test unit on it; the
    unit stopped afterwards (a peer holds GBs of the machine's RAM). Yields (site, install report)."""
    smollm_dir = cache_dir / "models" / SERVED     # `make models`
    assert (smollm_dir / "config.json").is_file(), f"{smollm_dir}: run make models"
    site = PeerSite(lab, lab.hosts[-1], unit, port)
    report = site.install(runtime)
    assert site.ddops("push-model", str(smollm_dir), "--host", site.name).returncode == 0
    site.forget()
    yield site, report
    site.remote.run(f"systemctl disable --now {unit}", check=False)
    site.remote.close()


class PeerSite(Site):
    bundled_answer = ""

    def __init__(self, lab, name: str, unit: str, port: str):
        super().__init__(lab, name)
        self.unit, self.port = unit, port

    @property
    def stem(self) -> str:
        return self.unit.removesuffix(".service")

    def deploy_json(self, profile: str, *extra: str) -> tuple[int, dict]:
        done = self.ddops("deploy", profile, "--host", self.name, "--unit", self.unit, "--port", self.port,
                          "--yes", "--json", *extra)
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)

    def unit_bytes(self) -> bytes | None:
        return self.remote.read(f"/etc/systemd/system/{self.unit}")

    def env_bytes(self) -> bytes | None:
        return self.remote.read(f"/etc/ddops/{self.stem}.env")

    def started(self) -> tuple[int, int, str]:
        out = self.remote.run(f"systemctl show {self.unit} -p ExecMainStartTimestampMonotonic -p NRestarts "
                              "-p ActiveState --value").stdout.split()
        return int(out[0]), int(out[1]), out[2]

    def forget(self) -> None:
        """No unit, env file, history or stage file of the test unit on the host."""
        self.remote.run(f"systemctl disable --now {self.unit}; rm -rf /etc/systemd/system/{self.unit} "
                        f"/etc/ddops/{self.stem}.env /var/lib/ddops/history/{self.unit} "
                        f"/var/lib/ddops/deploy/{self.unit}; systemctl daemon-reload", check=False)

    def install(self, runtime: str) -> dict:
        """`install-runtime --runtime RUNTIME` on this host: its report."""
        installed = self.ddops("install-runtime", "--runtime", runtime, "--host", self.name, "--json")
        assert installed.returncode == 0, installed.stdout + installed.stderr
        return json.loads(installed.stdout)["hosts"][0]["report"]

    def ask(self, key: str | None = TEST_API_KEY, content: str = "What is the capital of France?",
            max_tokens: int = 12) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": SERVED, "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens, "temperature": 0}
        return httpx.post(f"http://{self.host.address}:{self.port}/v1/chat/completions", json=body,
                          headers=headers, timeout=120, trust_env=False)
