"""Render a profile with one hostile value in one rendered field and read the unit and env file
back by systemd's rules (ddops.unitsyntax's readers): the value must come back unchanged, or be
refused at validation naming its key, and refused exactly when `should_refuse` says so. Shared by the property test and the report command:

    python -m tests.ops.roundtrip --n 20000      # prints N values, refused, differing, verify
"""

from __future__ import annotations

import argparse
import posixpath
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError

from ddops.profile import Profile
from ddops.render import RenderError, command_line, render
from ddops.unitsyntax import parse_env, setting_value, split_exec, unsafe_text

# (field, where the value goes in the profile); the path fields get a leading "/".
FIELDS = ("model.path", "speculative.draft_model_path", "service.working_dir", "service.python",
          "service.environment", "secret")
PATH_FIELDS = FIELDS[:4]
SPECIALS = "%$\"'\\;#` \t\n\r\x00\x7f\x85\u2028{}=*?[]~!@&|<>()\u00e9\u4e2d\U0001f600"


def profile_with(field: str, value: str) -> Profile:
    data = {"name": "roundtrip", "runtime": "bundled",
            "model": {"path": "/models/m", "served_name": "m"}, "service": {}}
    if field == "model.path":
        data["model"]["path"] = "/" + value
    elif field == "speculative.draft_model_path":
        data["speculative"] = {"algorithm": "dflash", "draft_model_path": "/" + value}
    elif field == "service.environment":
        data["service"]["environment"] = {"VALUE": value}
    elif field == "secret":
        data["service"]["secrets"] = {"api_key_env": "ROUNDTRIP_KEY"}
    else:
        data["service"][field.split(".")[1]] = "/" + value
    return Profile.model_validate(data)


def check(field: str, value: str) -> str:
    """"same", "refused" (validation named the field) or a description of the difference."""
    try:
        profile = profile_with(field, value)
        secrets = {"DDOPS_API_KEY": value} if field == "secret" else None
        rendered = render(profile, secrets=secrets)
    except ValidationError as exc:
        named = field.split(".")[-1]
        locs = [".".join(str(part) for part in err["loc"]) for err in exc.errors()]
        if not all(named in loc for loc in locs):
            return f"refused naming {locs}"
        return "refused" if should_refuse(field, value) else f"refused without cause: {exc.errors()[0]['msg']}"
    except RenderError as exc:
        return "refused" if field == "secret" and "secret DDOPS_API_KEY" in str(exc) else repr(exc)
    if should_refuse(field, value):
        return "accepted a value that cannot be written"
    return _compare(profile, rendered, secrets or {})


def should_refuse(field: str, value: str) -> bool:
    """The refusal rule, restated: control characters anywhere; for paths, anything systemd
    would normalize or a unit line would drop (trailing blank) or join (trailing backslash)."""
    if unsafe_text(value):
        return True
    if field not in PATH_FIELDS:
        return False
    path = "/" + value
    return "/" + posixpath.normpath(path).lstrip("/") != path or path != path.rstrip() or path.endswith("\\")


def _compare(profile: Profile, rendered, secrets: dict) -> str:
    unit = rendered.unit_text
    argv = split_exec(setting_value(unit, "ExecStart") or "")
    if argv != command_line(profile):
        return f"ExecStart read back as {argv!r}"
    service = profile.service
    if plain_setting(setting_value(unit, "WorkingDirectory") or "") != service.working_dir:
        return "WorkingDirectory= differs"
    if split_exec_paths(setting_value(unit, "ReadWritePaths") or "") != [service.working_dir]:
        return "ReadWritePaths= differs"
    if parse_env(rendered.env_text) != {**service.environment, **secrets}:
        return "env file differs"
    return "same"


def plain_setting(raw: str) -> str:
    """A plain setting's value as systemd reads it (specifiers resolved: only `%%` is ours)."""
    return raw.replace("%%", "%")


def split_exec_paths(raw: str) -> list[str]:
    """A path list setting's words: quoting and `%%` as in ExecStart, no `$` substitution."""
    return split_exec(raw.replace("$", "$$"))


def random_value(rng: random.Random) -> str:
    length = rng.choice((1, 2, 5, 20, 60))
    pool = SPECIALS if rng.random() < 0.6 else None
    return "".join(rng.choice(pool) if pool else _any_char(rng) for _ in range(length))


def _any_char(rng: random.Random) -> str:
    while True:
        char = chr(rng.randrange(0x20, 0x3000) if rng.random() < 0.9 else rng.randrange(0, 0x110000))
        if not 0xD800 <= ord(char) <= 0xDFFF:
            return char


def verify_sample(values: list[str]) -> tuple[int, list[str]]:
    """`systemd-analyze verify` on units whose model path, working directory and environment
    carry the values (interpreter: this Python, which exists); (units, complaints)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return 0, ["systemd-analyze not installed"]
    with tempfile.TemporaryDirectory() as folder:
        names = []
        for index, value in enumerate(values):
            try:
                profile = profile_with("model.path", value)
            except ValidationError:
                continue
            rendered = render(profile, unit_name=f"ddops-roundtrip-{index}")
            text = rendered.unit_text.replace(rendered.argv[0], sys.executable, 1)
            (Path(folder) / rendered.unit_name).write_text(text, encoding="utf-8")
            names.append(rendered.unit_name)
        done = subprocess.run([analyze, "verify", "--man=no", *(str(Path(folder) / n) for n in names)],
                              capture_output=True, text=True, timeout=300)
        lines = (done.stdout + done.stderr).splitlines()
        return len(names), [line for line in lines if "ddops-roundtrip-" in line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--verify", type=int, default=200, help="units for systemd-analyze verify")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts = {"same": 0, "refused": 0}
    differing = []
    for index in range(args.n):
        field, value = FIELDS[index % len(FIELDS)], random_value(rng)
        result = check(field, value)
        if result in counts:
            counts[result] += 1
        else:
            differing.append((field, value, result))
    units, complaints = verify_sample([random_value(rng) for _ in range(args.verify)])
    print(f"{args.n} values over {len(FIELDS)} fields: {counts['same']} read back unchanged, "
          f"{counts['refused']} refused at validation naming the key, {len(differing)} differing")
    print(f"systemd-analyze verify: {units} units with random values, {len(complaints)} complaints")
    for field, value, result in differing[:10] + [("verify", "", c) for c in complaints[:10]]:
        print(f"  {field} {value!r}: {result}")
    sys.exit(1 if differing or complaints else 0)


if __name__ == "__main__":
    main()
