"""One framing for several answers in one remote read (ddops/remote/framing.py): the shell it
writes runs here in a real `sh`, as it does on a host, and no content (`@@`, NULs, newlines, a
line shaped like a frame, a path with spaces) is taken for a frame. A history written and read
through the same code lists back exactly; the lab test that deploys such a history and rolls
back to it is tests/deploy/test_lab_deploy.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ddops.deploy import history
from ddops.deploy.gate import GateSpec
from ddops.deploy.plan import Desired
from ddops.remote import Result, framing

NASTY = b"@@\n@@shown@@\nb25l +eEBA\n\x00\xff -\n+\n \n"    # last is a frame-shaped line of its own


class Shell:
    """This machine's sh in Remote's place, for the readers' fast tests (commands and writes)."""

    def run(self, command: str, check: bool = True, timeout: float | None = None) -> Result:
        done = subprocess.run(["sh", "-c", command], capture_output=True, timeout=timeout or 30)
        result = Result(command, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode())
        assert result.ok or not check, result
        return result

    def write(self, path: str, data: bytes | str, mode: int = 0o644, owner: str | None = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data.encode() if isinstance(data, str) else data)


def test_any_bytes_and_missing_files_come_back_by_name(tmp_path):
    (tmp_path / "nasty").write_bytes(NASTY)
    (tmp_path / "empty").write_bytes(b"")
    answers = framing.ask(Shell(), framing.file("nasty", str(tmp_path / "nasty")),
                          framing.file("@@ odd name\n", str(tmp_path / "empty")),
                          framing.file("missing", str(tmp_path / "missing")),
                          framing.output("printed", f"cat {tmp_path / 'nasty'}; printf '\\n@@now\\n17'"))
    assert answers == {"nasty": NASTY, "@@ odd name\n": b"", "missing": None,
                       "printed": NASTY + b"\n@@now\n17"}


def test_each_file_is_named_by_its_path_even_with_spaces_and_at_signs(tmp_path):
    for name in ("a@@ b", "c +-", "d"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_bytes(NASTY + name.encode())
    answers = framing.ask(Shell(), framing.each_file(f"'{tmp_path}'/*/meta.json"))
    assert answers == {str(tmp_path / n / "meta.json"): NASTY + n.encode() for n in ("a@@ b", "c +-", "d")}


@pytest.mark.parametrize("line", ["@@shown@@", "bm93", "bm93 17", "bm93 +not base64!", "bm93 -x", "????? +"])
def test_a_line_that_is_not_a_frame_is_refused_not_guessed(line):
    with pytest.raises(framing.FramingError):
        framing.parse_line(line)


def test_a_history_with_at_signs_in_every_field_lists_back_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(history, "history_dir", lambda unit: f"{tmp_path}/history/{unit}")
    odd = "@@ +-\n@@"
    desired = Desired("ddx.service", f"/etc/systemd/system/ddx.service{odd}", "[Unit]\n", f"/etc/ddops/{odd}.env",
                      "DDOPS_API_KEY=sk-1\n", f"cpu-ar+-{odd}", "ab" * 32)
    spec = GateSpec(base_url="http://h:1", model_path=f"/m/{odd}", served_model=odd, algorithm=None,
                    speculative=False, messages=({"role": "user", "content": odd},))
    record = history.Record.of(desired, {"user": odd, "command": f"ddops deploy /p/{odd}.yaml"}, 1.5, "failed",
                               gate_spec=spec, gate={"passed": False, "checks": [{"detail": odd}]},
                               diagnosis=({"cause": "model-path-missing", "evidence": odd},),
                               forced=({"check": "model-missing", "reason": odd},))
    shell = Shell()
    first = history.record(shell, (), desired.unit_text, desired.env_text, record)
    second = history.update_result(shell, history.record(shell, (first.dirname,), "u", "", record),
                                   result="failed-reverted", revert=odd)
    listed = history.entries(shell, "ddx.service")
    assert [e.id for e in listed] == ["0001", "0002"] and listed == [first, second]
    assert listed[1].record.gate_spec == spec and listed[1].record.revert == odd
    assert listed[0].record.secrets == {"DDOPS_API_KEY": history.fingerprint("sk-1")}
    assert history.entries(shell) == listed        # every unit's entries: the other glob


def test_a_meta_json_that_does_not_parse_is_listed_unreadable(tmp_path, monkeypatch):
    monkeypatch.setattr(history, "history_dir", lambda unit: f"{tmp_path}/history/{unit}")
    (tmp_path / "history" / "ddx.service" / "0001-x").mkdir(parents=True)
    (tmp_path / "history" / "ddx.service" / "0001-x" / "meta.json").write_text('{"profile": "cut sh')
    [entry] = history.entries(Shell(), "ddx.service")
    assert (entry.id, entry.record.result) == ("0001", "unreadable")
