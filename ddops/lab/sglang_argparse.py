"""The SGLang flag table and the shipped profiles against a released SGLang's own parser, for a
release that cannot run here (docs/sglang.md "Flags against the real parser"):

    python -m ddops.lab.sglang_argparse --version 0.5.23 --python $DDOPS_CACHE/sglang-argparse-0.5.23/bin/python

`make sglang-argparse` builds that venv once (CPU torch + `sglang==V --no-deps` + what its
argument module imports; 2.3 GB, no GPU) and runs this. 0.5.15, which serves here, is checked
by the lab test on a host's own install (tests/deploy/test_lab_sglang.py). Checks, each a line:

- every shipped profile declaring this release renders a command line SGLang's
  `prepare_server_args` accepts; a `+ddtree` profile with the PR's words taken out (its
  DDTREE algorithm read as DFLASH, the one it drafts with), since the release lacks them;
- the table's facts for the release: the flags it says the release added exist, the spellings
  it says were removed are refused, every algorithm it lists is one the release knows, the
  KV cache dtypes are the parser's choices, and the PR's flags and algorithm are not there.

Prints one JSON document (also to --json FILE); exit 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ddops.profile import list_profiles, load_profile
from ddops.profile.runtimes import RUNTIMES
from ddops.profile.sglang_versions import (DDTREE_ALGORITHMS, DDTREE_FLAGS, KV_DTYPE_RENAMES, RENAMES, at_least,
                                          flags_for)
from ddops.render import command_line

# Run by the release's interpreter: argv lists in (stdin JSON), each one's verdict out. The parser
# is SGLang's own; nothing here resolves hardware (that is ServerArgs.resolve_once, later).
PROBE = r"""
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
asked = json.load(sys.stdin)
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
def verdict(argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            prepare_server_args(argv)
        return {"ok": True}
    except SystemExit as exc:
        return {"ok": False, "exit": exc.code, "error": err.getvalue().strip().splitlines()[-1:]}
    except Exception as exc:
        return {"ok": False, "error": [f"{type(exc).__name__}: {exc}"]}
def knows(name):
    try:
        SpeculativeAlgorithm.from_string(name)
        return True
    except ValueError:
        return False
kv = next(a.choices for a in parser._actions if "--kv-cache-dtype" in a.option_strings)
print(json.dumps({
    "options": sorted(o for a in parser._actions for o in a.option_strings),
    "kv_cache_dtypes": sorted(kv or []),
    "algorithms": sorted(m.name for m in SpeculativeAlgorithm if m.name != "NONE"),
    "knows": {name: knows(name) for name in asked["algorithms"]},
    "argv": {name: verdict(argv) for name, argv in asked["argv"].items()},
}))
"""


def released_argv(argv: list[str], pr: bool) -> list[str]:
    """A rendered SGLang argv as the release takes it: without the DDTree PR's flags, and its
    DDTREE algorithm read as DFLASH (what DDTree drafts with), when the profile declares the PR."""
    if not pr:
        return argv
    out, skip = [], False
    for i, word in enumerate(argv):
        if skip:
            skip = False
        elif word in DDTREE_FLAGS:
            skip = True
        elif i and argv[i - 1] == "--speculative-algorithm" and word.upper() in DDTREE_ALGORITHMS:
            out.append("DFLASH")
        else:
            out.append(word)
    return out


def profile_argvs(version: str, key_file: str) -> dict[str, list[str]]:
    """{profile: the words after `-m sglang.launch_server`} of every shipped profile declaring
    this release, its --config pointed at a key file like the one ExecStartPre writes."""
    found = {}
    for name in list_profiles():
        profile = load_profile(name)
        declared = profile.sglang_version
        # versioned_flags: the runtime table's mark of a runtime whose flags follow a declared version
        if not RUNTIMES[profile.runtime].versioned_flags or not declared or declared.split("+")[0] != version:
            continue
        argv = command_line(profile)
        argv = argv[argv.index("sglang.launch_server") + 1:]
        argv[argv.index("--config") + 1] = key_file
        found[name] = released_argv(argv, declared.endswith("+ddtree"))
    return found


def table_probes(version: str) -> dict[str, list[str]]:
    """argv lists that exercise the table's renames: each old spelling (or KV cache dtype value)
    the table says this release removed, with a value."""
    base = ["--model-path", "/nonexistent"]
    probes = {f"removed {r.old}": base + [r.old, "4"] for r in RENAMES
              if r.removed_in and at_least(version, r.removed_in)}
    probes.update({f"removed --kv-cache-dtype {old}": base + ["--kv-cache-dtype", old]
                   for old, (_, since) in KV_DTYPE_RENAMES.items() if at_least(version, since)})
    return probes


def checks(version: str, seen: dict) -> list[dict]:
    flags = flags_for(version)
    options, argv = set(seen["options"]), seen["argv"]
    rows = [{"check": f"profile {name} parses", "ok": v["ok"], "detail": v.get("error")}
            for name, v in argv.items() if not name.startswith("removed ")]
    rows += [{"check": f"{flag} exists (added by {flags.release} or earlier)", "ok": flag in options}
             for flag in sorted(flags.added)]
    rows += [{"check": f"{name}: refused", "ok": not v["ok"], "detail": v.get("error")}
             for name, v in argv.items() if name.startswith("removed ")]
    rows += [{"check": f"{' '.join(r.new[:1])} exists (replaces {r.old})", "ok": r.new[0] in options}
             for r in RENAMES if r.removed_in is None or at_least(version, r.removed_in)]
    rows += [{"check": f"algorithm {a} known", "ok": seen["knows"][a]} for a in sorted(flags.algorithms)]
    rows += [{"check": f"{flag} (the DDTree PR's) absent from the release", "ok": flag not in options}
             for flag in sorted(DDTREE_FLAGS)]
    rows += [{"check": f"algorithm {a} (the DDTree PR's) unknown to the release", "ok": not seen["knows"][a]}
             for a in sorted(DDTREE_ALGORITHMS)]
    rows.append({"check": "KV cache dtypes are the parser's choices", "ok":
                 sorted(flags.kv_cache_dtypes) == seen["kv_cache_dtypes"],
                 "detail": {"table": sorted(flags.kv_cache_dtypes), "parser": seen["kv_cache_dtypes"]}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddops.lab.sglang_argparse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", required=True, help="the release, e.g. 0.5.23")
    parser.add_argument("--python", required=True, help="an interpreter with that release installed")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    flags = flags_for(args.version)
    with tempfile.TemporaryDirectory() as tmp:
        key_file = str(Path(tmp, "key.yaml"))
        Path(key_file).write_text('api-key: "k"\n')
        asked = {"argv": {**profile_argvs(args.version, key_file), **table_probes(args.version)},
                 "algorithms": sorted(flags.algorithms | DDTREE_ALGORITHMS)}
        done = subprocess.run([args.python, "-c", PROBE], input=json.dumps(asked), capture_output=True,
                              text=True, cwd=tmp, env={"HOME": tmp, "PATH": "/usr/bin:/bin"}, timeout=300)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
        return 1
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    rows = checks(args.version, seen)
    report = {"version": args.version, "options": len(seen["options"]), "checks": rows,
              "untabulated_algorithms": sorted(set(seen["algorithms"]) - flags.algorithms),
              "passed": all(r["ok"] for r in rows)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
