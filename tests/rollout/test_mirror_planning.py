"""Mirroring's opt-in and planning refusals (docs/mirror.md): pure, no host contacted."""

import pytest
import yaml

from ddops.profile import load_profile
from ddops.profile.yamlfile import ConfigError
from ddops.inventory import Host
from ddops.exits import BadInput
from ddops.rollout.shadow.compare import Endpoint
from ddops.rollout.shadow.mirrored import Mirrored, has_sink, judge_mirrored, refuse_unless_mirrorable
from ddops.profile.analysis import MirrorRequirement
from ddops.render import command_line, render


def profile(tmp_path, base: str, **service):
    path = tmp_path / f"{base}-{len(service)}.yaml"
    path.write_text(yaml.safe_dump({"extends": base, "service": service}))
    return load_profile(str(path))


def test_opt_in_renders_the_flag_and_other_runtimes_are_refused(tmp_path):
    assert "--enable-mirror" in command_line(profile(tmp_path, "cpu-ar", mirror=True))
    assert "--enable-mirror" not in command_line(profile(tmp_path, "cpu-ar"))
    sglang = " ".join(command_line(profile(tmp_path, "cpu-smollm2-sglang", mirror=True)))
    assert "--log-requests --log-requests-level 3 --log-requests-format json" in sglang
    assert "--log-requests" not in command_line(profile(tmp_path, "cpu-smollm2-sglang"))
    assert has_sink("bundled") and not has_sink("sglang") and not has_sink("vllm")
    logging = command_line(profile(tmp_path, "cpu-smollm2-vllm", mirror=True))
    assert logging[-5:] == ["--enable-log-requests", "--enable-log-outputs", "--no-enable-log-deltas",
                            "--log-level", "DEBUG"]
    assert "--log-level" not in command_line(profile(tmp_path, "cpu-smollm2-vllm"))


NOWHERE = Endpoint("production", "http://127.0.0.1:9")   # a request_log source is never asked over HTTP


def plan(tmp_path, production_base: str, host: Host | None = None, **service):
    """Planning against production's rendered unit (what its host's unit file holds)."""
    unit = render(profile(tmp_path, production_base, **service)).unit_text
    return refuse_unless_mirrorable(load_profile("cpu-ddtree"), host or Host(name="p1", address="10.0.0.1"),
                                    unit, NOWHERE)


def test_vllm_production_mirrors_through_its_logs_once_its_profile_opts_in(tmp_path):
    source = plan(tmp_path, "cpu-smollm2-vllm", mirror=True)
    assert source.kind == "request_log" and source.model == "/var/lib/ddops/models/smollm2-135m-instruct"
    with pytest.raises(BadInput, match="does not log its requests.*--enable-log-requests"):
        plan(tmp_path, "cpu-smollm2-vllm")


@pytest.mark.parametrize("base, section, extra", [
    ("cpu-smollm2-vllm", "vllm", ["--max-log-len", "100"]),                       # ids cut without a mark
    ("cpu-smollm2-sglang", "sglang", ["--log-requests-target", "/var/log/sglang"]),   # logs to files, not the journal
])
def test_production_whose_logs_the_relay_cannot_read_whole_is_refused(tmp_path, base, section, extra):
    path = tmp_path / "cut.yaml"
    path.write_text(yaml.safe_dump({"extends": base, "service": {"mirror": True}, section: {"extra_args": extra}}))
    unit = render(load_profile(str(path))).unit_text
    with pytest.raises(BadInput, match=f"{extra[0]}, which keeps whole request logs from the relay"):
        refuse_unless_mirrorable(load_profile("cpu-ddtree"), Host(name="p1", address="10.0.0.1"), unit, NOWHERE)


def test_sglang_production_mirrors_through_its_json_logs_once_its_profile_opts_in(tmp_path):
    source = plan(tmp_path, "cpu-smollm2-sglang", mirror=True)
    assert (source.kind, source.dialect) == ("request_log", "sglang")
    assert source.model == "/var/lib/ddops/models/smollm2-135m-instruct"
    with pytest.raises(BadInput, match="does not log its requests.*--log-requests --log-requests-level 3"):
        plan(tmp_path, "cpu-smollm2-sglang")
    with pytest.raises(BadInput, match="does not log its requests"):
        plan(tmp_path, "a6000-base")


def test_a_host_the_inventory_forbids_is_refused_whatever_its_profile_says(tmp_path):
    forbidden = Host(name="p1", address="10.0.0.1", mirror=False)
    with pytest.raises(BadInput, match="inventory forbids mirroring p1's requests.*hosts.p1.mirror: false"):
        plan(tmp_path, "cpu-smollm2-vllm", forbidden, mirror=True)


def sink(requests: int, equality: float | None, accept: float | None) -> dict:
    return {"compared": requests, "received": requests, "dropped": 0, "failed": 0, "samples": [],
            "deterministic": {"token_equality": equality}, "distribution": {},
            "shadow": {"accept_length": accept}}


def test_requirement_checks_count_equality_and_accepted_length():
    need = MirrorRequirement(min_requests=16, min_token_equality=1.0, min_accept_length=2.0)
    assert judge_mirrored(Mirrored({}, sink(16, 1.0, 2.5)), need).passed
    failed = judge_mirrored(Mirrored({}, sink(15, 0.99, 1.5)), need)
    assert [c.name for c in failed.checks if not c.passed] == [
        "mirrored requests", "mirrored token equality", "mirrored accepted length"]
    assert not judge_mirrored(Mirrored({}, sink(20, None, None)), need).passed   # nothing deterministic


def test_a_text_difference_fails_the_equality_floor_like_a_token_difference():
    """Records compared by text (streamed vLLM chats) meet min_token_equality too."""
    need = MirrorRequirement(min_requests=16, min_token_equality=1.0, min_accept_length=None)

    def by_text(ids: float | None, text: float | None) -> Mirrored:
        doc = sink(16, ids, 1.0)
        doc["text"] = {"requests": 8, "equal": 8, "matched_chars": 1, "compared_chars": 1,
                       "text_equality": text, "sampled": 0}
        return Mirrored({}, doc)
    assert judge_mirrored(by_text(None, 1.0), need).passed                 # all streamed, all equal
    assert judge_mirrored(by_text(1.0, 1.0), need).passed
    failed = judge_mirrored(by_text(1.0, 0.98), need)
    assert [c.name for c in failed.checks if not c.passed] == ["mirrored text equality"]
    assert [c.name for c in judge_mirrored(by_text(None, 0.5), need).checks] == [
        "mirrored requests", "mirrored text equality"]
    forged = by_text(1.0, 1.0)
    forged.sink["text"] = {**forged.sink["text"], "text_equality": "1.0<script>"}
    with pytest.raises(BadInput, match="malformed text field"):
        judge_mirrored(forged, need)


def test_compare_mirrored_with_nothing_listening_is_unreachable_not_a_crash(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from ddops.cli import app
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    dead = "http://127.0.0.1:9"          # discard port: nothing listens
    result = CliRunner().invoke(app, ["shadow", "compare", "--mirrored", "--json", "--production-url", dead,
                                      "--shadow-url", dead])
    assert result.exit_code == 6 and "production at http://127.0.0.1:9" in json.loads(result.stdout)["error"]


def test_inventory_mirror_setting_is_read_and_checked(tmp_path):
    from ddops.inventory import InventoryError, load_inventory
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"mirror": False},
                                    "hosts": {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2", "mirror": True}}}))
    hosts = load_inventory(path).hosts
    assert (hosts["a"].mirror, hosts["b"].mirror) == (False, True)
    path.write_text(yaml.safe_dump({"hosts": {"a": {"address": "10.0.0.1", "mirror": "no"}}}))
    with pytest.raises(InventoryError, match="hosts.a.mirror"):
        load_inventory(path)
    assert load_inventory(_plain(tmp_path)).hosts["c"].mirror      # allowed unless the inventory says not


def _plain(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"c": {"address": "10.0.0.3"}}}))
    return path
