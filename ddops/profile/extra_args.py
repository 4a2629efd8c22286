"""`sglang.extra_args` / `vllm.extra_args`: flags ddops does not model (tool-call parser,
quantization, attention backend, ...), passed through to the command line after the modelled
flags, as written. The runtime's table names the section it reads (`extra_args_section`); the
other runtime's section set is refused, naming the key.

Checked here, without a host: each word is one printable line; the list starts with a flag and
each value follows its flag; no flag ddops already renders from a profile key (name the key
instead); with `sglang_version`, the version table names a removed or renamed flag and its
replacement, and a vLLM profile's flags must be in its release's parser facts (ddops.vllm);
a flag whose value `ddops fit` reads (--max-total-tokens: either runtime's K/V pool
rows) carries a positive integer, and a switch it reads (--disable-radix-cache: the bundled
runtime keeps no prefix store) carries no value. With a host, deploy's planning checks every flag against the
installed runtime's own --help (ddops.deploy.refusals). `ddops fit` warns about those that
change memory use in a way it does not model.
"""

from __future__ import annotations

from ddops.profile.runtimes import POOL_CAP_FLAG, RUNTIMES
from ddops.profile.schema import value_at
from ddops.profile.sglang_versions import RENAMES, VersionError, flags_for, unknown_flags
from ddops.vllm import versions as vllm_versions

SECTIONS = ("sglang", "vllm")
# Flags ddops renders itself that have no row in the flag tables.
RENDERED = {"--api-key": "service.secrets", "--model": "model.path",
            "--speculative-draft-model": "speculative.draft_model_path"}
# Flags whose value ddops.fit reads: a positive integer each.
READ_BY_FIT = (POOL_CAP_FLAG,)
# Switches ddops.fit reads: present or not, no value.
SWITCHES_READ_BY_FIT = ("--disable-radix-cache",)
# Flags whose memory effect ddops.fit does not model (its prediction may then be off).
MEMORY = frozenset({
    "--quantization", "--max-prefill-tokens", "--page-size", "--dp-size", "--dp",
    "--enable-dp-attention", "--pp-size", "--cpu-offload-gb", "--speculative-draft-kv-cache-dtype",
    "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill", "--cuda-graph-bs", "--torch-compile-max-bs",
    "--enable-torch-compile", "--swa-full-tokens-ratio", "--mamba-full-memory-ratio", "--enable-lora",
    "--max-loras-per-batch", "--max-lora-rank", "--load-format", "--enable-hierarchical-cache",
    "--hicache-ratio", "--hicache-size", "--enable-memory-saver", "--ep-size", "--moe-a2a-backend",
})


def flags_in(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def values_of(args: list[str], flag: str) -> list[str | None]:
    """Each value given to `flag` (`--flag V` or `--flag=V`), in order; None for one left without."""
    found = []
    for i, arg in enumerate(args):
        if arg == flag:
            following = args[i + 1] if i + 1 < len(args) else None
            found.append(None if following is None or following.startswith("--") else following)
        elif arg.startswith(flag + "="):
            found.append(arg.split("=", 1)[1])
    return found


def key_of(profile) -> str:
    return f"{RUNTIMES[profile.runtime].extra_args_section}.extra_args"


def args_of(profile) -> list[str]:
    """The extra arguments the profile's runtime appends (its own section's)."""
    return list(getattr(profile, RUNTIMES[profile.runtime].extra_args_section).extra_args)


def int_value(profile, flag: str) -> int | None:
    """The value `flag` takes from the extra arguments (the last one given, as argparse keeps), or
    None; `problems` has already refused one that is not a positive integer."""
    values = values_of(args_of(profile), flag)
    return int(values[-1]) if values else None


def switch_on(profile, flag: str) -> bool:
    """Whether the extra arguments pass the switch `flag`."""
    return flag in flags_in(args_of(profile))


def modelled(profile) -> dict[str, str]:
    """Flag spelling (every tabulated version's) -> the profile key that renders it."""
    table = {f.flag: f.key for f in RUNTIMES[profile.runtime].flags
             if f.flag and (f.when is None or value_at(profile, f.key) == f.when)}
    table.update({alias: f.key for f in RUNTIMES[profile.runtime].flags for alias in f.aliases})
    for rename in RENAMES:
        if rename.old in table:
            table.update({new: table[rename.old] for new in rename.new if new.startswith("--")})
    return {**table, **RENDERED}


def problems(profile) -> list[tuple[str, str]]:
    args, key = args_of(profile), key_of(profile)
    found = [(f"{section}.extra_args", f"set, but runtime {profile.runtime} appends "
              f"{key} (move them there, spelled for {profile.runtime})")
             for section in SECTIONS if f"{section}.extra_args" != key and getattr(profile, section).extra_args]
    found += [(f"{key}[{i}]", f"{arg!r}: one printable line, no control characters")
             for i, arg in enumerate(args) if not arg.isprintable()]
    if args and not args[0].startswith("--"):
        found.append((f"{key}[0]", f"{args[0]!r}: the list starts with a flag (--name), values follow it"))
    found += [(key, f"{flag} {value or '(no value)'}: must be a positive integer (`ddops fit` sizes "
                    f"the K/V pool from it)")
              for flag in READ_BY_FIT for value in values_of(args, flag) if not _positive(value)]
    found += [(key, f"{flag} {value}: a switch takes no value (the runtime would reject {value!r})")
              for flag in SWITCHES_READ_BY_FIT for value in values_of(args, flag) if value is not None]
    owned = modelled(profile)
    found += [(key, f"{flag} is rendered by ddops from {owned[flag]}: set that key instead")
              for flag in flags_in(args) if flag in owned]
    if profile.sglang_version and RUNTIMES[profile.runtime].versioned_flags:
        try:
            found += [(key, reason) for reason in unknown_flags(flags_for(profile.sglang_version), flags_in(args))]
        except VersionError:
            pass    # the sglang_version rule reports it
    if RUNTIMES[profile.runtime].extra_args_section == "vllm":
        try:
            facts = vllm_versions.facts_for(profile.vllm_version)
            found += [(key, reason) for reason in vllm_versions.unknown_flags(facts, flags_in(args))]
        except vllm_versions.VersionError:
            pass    # the vllm_version rule reports it
    return found


def memory_warnings(profile) -> list[str]:
    return [f"{key_of(profile)} {flag} changes memory use in a way `ddops fit` does not model: the prediction may be off"
            for flag in flags_in(args_of(profile)) if flag in MEMORY]


def _positive(value: str | None) -> bool:
    return value is not None and value.isascii() and value.isdigit() and int(value) > 0
