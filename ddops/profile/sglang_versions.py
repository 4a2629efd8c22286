"""SGLang launch flags by version: which spelling each release accepts, and what replaced what.

Facts from the released wheels (docs/references.md, section "SGLang flags by version"): 0.5.15 still accepts the old
spellings as deprecated aliases; 0.5.23 removed them (argparse prefix matching turns the old
`--cuda-graph-max-bs` into "ambiguous option"), except `--disable-cuda-graph`, still a deprecated
alias in both. DDTree is in no release: it comes from PR #29907, declared as a local version
label, e.g. `0.5.23+ddtree`. DFlash 2 drafts (DFlash2DraftModel) load under the same
`--speculative-algorithm DFLASH` from the first release with PR #35371 (merged 2026-08-19),
0.5.19; earlier releases know only DFlashDraftModel (docs/spec.md, "DFlash 2 drafts").

The runtime flag table (runtimes.py) names each setting once; `spell` turns that name into the
declared version's spelling, and `unknown_flags` names a flag a version lacks with its
replacement. Nothing here compares a speculative method's name: `algorithms` is data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?(\+ddtree)?$")
DDTREE_PR = "sgl-project/sglang PR #29907"


@dataclass(frozen=True)
class Rename:
    old: str  # the spelling a profile's table or an old model card uses
    new: tuple[str, ...]  # what a version without the old spelling takes instead (`--flag value` words)
    deprecated_in: str  # first tabulated release that warns about the old spelling
    removed_in: str | None  # first tabulated release that rejects it (None: still accepted)


@dataclass(frozen=True)
class Release:
    version: str
    algorithms: frozenset[str]  # --speculative-algorithm values it accepts
    added: frozenset[str]  # flags this release (and later ones) accept beyond the common set
    kv_cache_dtypes: frozenset[str]


RENAMES: tuple[Rename, ...] = (
    Rename("--cuda-graph-max-bs", ("--cuda-graph-max-bs-decode",), "0.5.15", "0.5.23"),
    Rename("--mamba-scheduler-strategy", ("--mamba-radix-cache-strategy",), "0.5.15", "0.5.23"),
    Rename("--speculative-dflash-draft-window-size", ("--speculative-draft-window-size",), "0.5.15", "0.5.23"),
    # Deprecated, still accepted: it now means both graph backends disabled.
    Rename("--disable-cuda-graph", ("--cuda-graph-backend-decode", "disabled",
                                    "--cuda-graph-backend-prefill", "disabled"), "0.5.15", None),
)

_KV_0515 = frozenset({"auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"})
# 0.5.23's --kv-cache-dtype choices no longer list fp4_e2m1 (its parser refuses it; fp4_mx_block16
# replaces it): checked against the released wheel's parser by `make sglang-argparse`.
_KV_0523 = (_KV_0515 - {"fp4_e2m1"}) | {"mxfp8", "nvfp4", "fp4_mx_block16"}
KV_DTYPE_RENAMES = {"fp4_e2m1": ("fp4_mx_block16", "0.5.23")}  # old value -> (replacement, rejected since)
RELEASES: tuple[Release, ...] = (
    Release("0.5.15", frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH"}),
            frozenset({"--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill",
                       "--mamba-radix-cache-strategy", "--speculative-draft-window-size",
                       "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill"}), _KV_0515),
    Release("0.5.23", frozenset({"DSPARK", "UNO"}),
            frozenset({"--speculative-draft-kv-cache-dtype"}),
            _KV_0523),
)
# Draft architecture (serving/contract/drafts.py names) -> first release whose DFLASH worker builds
# it. DFlash2DraftModel: PR #35371 "[Spec] DFlash2: local convolution + candidate selector", merged
# 2026-08-19, first released in 0.5.19; no new flag or algorithm spelling.
DRAFT_ARCHS_SINCE = {"DFlashDraftModel": "0.5.15", "DFlash2DraftModel": "0.5.19"}
DDTREE_ALGORITHMS = frozenset({"DDTREE"})
DDTREE_FLAGS = frozenset({"--speculative-ddtree-budget"})


class VersionError(ValueError):
    """A version string this table cannot place; the message is one line."""


@dataclass(frozen=True)
class Flags:
    """What one declared version accepts."""

    version: str
    release: str  # the tabulated release whose flags apply
    algorithms: frozenset[str]
    added: frozenset[str]
    kv_cache_dtypes: frozenset[str]
    ddtree_pr: bool
    draft_archs: frozenset[str] = frozenset()

    def renamed(self, flag: str) -> Rename | None:
        """The rename whose old spelling this version no longer prefers, if any."""
        return next((r for r in RENAMES if r.old == flag and at_least(self.release, r.deprecated_in)), None)

    def rejects(self, flag: str) -> Rename | None:
        rename = self.renamed(flag)
        return rename if rename and rename.removed_in and at_least(self.release, rename.removed_in) else None

    def accepts(self, flag: str) -> bool:
        if self.rejects(flag):
            return False
        known_later = {f for r in RELEASES for f in r.added} | DDTREE_FLAGS
        return flag not in known_later or flag in self.added


def _key(version: str) -> tuple[int, int, int]:
    match = VERSION.match(version)
    return tuple(int(g) for g in match.groups()[:3])  # type: ignore[union-attr, return-value]


def at_least(version: str, other: str) -> bool:
    return _key(version) >= _key(other)


def flags_for(version: str) -> Flags:
    """The flags of a declared version: the newest tabulated release not after it (+ the PR)."""
    match = VERSION.match(version.strip())
    if not match:
        raise VersionError(f"{version!r} is not a version like 0.5.23 or 0.5.23+ddtree")
    known = [r for r in RELEASES if _key(r.version) <= _key(version)]
    if not known:
        raise VersionError(f"{version} predates the tabulated releases "
                           f"({', '.join(r.version for r in RELEASES)}); DFLASH arrived in 0.5.15")
    ddtree = match.group(4) is not None
    algorithms = frozenset().union(*(r.algorithms for r in known)) | (DDTREE_ALGORITHMS if ddtree else frozenset())
    added = frozenset().union(*(r.added for r in known)) | (DDTREE_FLAGS if ddtree else frozenset())
    drafts = frozenset(arch for arch, since in DRAFT_ARCHS_SINCE.items() if at_least(version.split("+")[0], since))
    return Flags(version, known[-1].version, algorithms, added, known[-1].kv_cache_dtypes, ddtree, drafts)


def draft_refusal(flags: Flags, arch: str) -> str | None:
    """Why this SGLang cannot build a draft of architecture `arch`, one line, or None."""
    if arch in flags.draft_archs:
        return None
    since = DRAFT_ARCHS_SINCE.get(arch)
    later = (f"it loads from SGLang {since} (--speculative-algorithm DFLASH)" if since
             else "no tabulated SGLang release loads it")
    return f"SGLang {flags.version} cannot load a {arch} draft: {later}"


def spell(flags: Flags | None, words: list[str]) -> list[str]:
    """Launch words (`--flag [value]`) in the declared version's spelling; unchanged when undeclared."""
    if flags is None or not words:
        return words
    rename = flags.renamed(words[0])
    if rename is None:
        return words
    if len(rename.new) == 1:
        return [rename.new[0], *words[1:]]
    return list(rename.new)  # a switch replaced by flag/value pairs


def unknown_flags(flags: Flags, argv_flags: list[str]) -> list[str]:
    """One reason per flag the version does not accept, naming the replacement."""
    reasons = []
    for flag in argv_flags:
        rename = flags.rejects(flag)
        if rename:
            reasons.append(f"{flag} was removed in SGLang {rename.removed_in}; use {' '.join(rename.new)}")
        elif not flags.accepts(flag):
            base = flags.version.split("+")[0]
            where = (f"a build with {DDTREE_PR}, declared as {base}+ddtree" if flag in DDTREE_FLAGS
                     else "a newer release")
            reasons.append(f"{flag} is not in SGLang {flags.version}: needs {where}")
    return reasons


def deprecations(flags: Flags, argv_flags: list[str]) -> list[str]:
    """Warnings for spellings the version still accepts but has replaced."""
    found = []
    for flag in argv_flags:
        rename = flags.renamed(flag)
        if rename and not flags.rejects(flag):
            found.append(f"{flag} is deprecated since SGLang {rename.deprecated_in}; "
                         f"use {' '.join(rename.new)}")
    return found
