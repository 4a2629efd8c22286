"""The rendered units are read by the real systemd unit parser without a complaint.

`systemd-analyze verify` parses the unit the way PID 1 does and reports unknown keys, bad
values and a missing executable. The interpreter path is pointed at one that exists here;
everything else is verified as rendered.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from ddops.profile import list_profiles, load_profile
from ddops.render import render
from tests.ops.helpers import SHIPPED

ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")


def verify(tmp_path, units: dict[str, str]) -> dict[str, str]:
    """Unit name -> systemd's complaints about that file ("" when none). One parser run."""
    for name, text in units.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    proc = subprocess.run([ANALYZE, "verify", "--man=no", *(str(tmp_path / n) for n in units)],
                          capture_output=True, text=True, timeout=60)
    lines = (proc.stdout + proc.stderr).splitlines()
    # Complaints about a file name it; other units on the machine are not ours to judge.
    return {name: "\n".join(line for line in lines if name in line) for name in units}


def test_systemd_accepts_every_rendered_unit(tmp_path):
    units = {}
    for name in list_profiles(SHIPPED):
        rendered = render(load_profile(name, SHIPPED), unit_name=f"ddops-verify-{name}")
        units[rendered.unit_name] = rendered.unit_text.replace(rendered.argv[0], sys.executable)
    complaints = verify(tmp_path, units)
    assert complaints == {name: "" for name in units}


def test_the_check_catches_what_it_should(tmp_path):
    rendered = render(load_profile("cpu-ar", SHIPPED), unit_name="ddops-verify-bad")
    broken = rendered.unit_text.replace(rendered.argv[0], sys.executable)
    broken = broken.replace("Restart=on-failure", "Restart=sometimes").replace("Type=exec", "Typo=exec")
    missing = rendered.unit_text.replace(rendered.argv[0], "/nonexistent/bin/python")
    complaints = verify(tmp_path, {"ddops-verify-bad.service": broken,
                                   "ddops-verify-missing.service": missing})
    assert "Typo" in complaints["ddops-verify-bad.service"]
    assert "sometimes" in complaints["ddops-verify-bad.service"]
    assert "not executable" in complaints["ddops-verify-missing.service"]
