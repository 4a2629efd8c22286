"""Rules that relate settings to each other, as (key, reason) pairs.

Pure: a validated Profile in, problems out. Every rule reads method and runtime
capabilities (METHODS, RUNTIMES), never a method's name.
"""

from __future__ import annotations

from pydantic import BaseModel

from ddops.profile.methods import METHODS
from ddops.profile.runtimes import RUNTIME_KEYS, RUNTIMES
from ddops.profile.schema import Profile, value_at
from ddops.profile.sglang_versions import KV_DTYPE_RENAMES, VersionError, flags_for, spell, unknown_flags
from ddops.vllm import versions as vllm_versions

# Every variable some runtime reads its key from: reserved in service.environment, masked in history.
API_KEY_VARS: tuple[str, ...] = tuple(dict.fromkeys(r.api_key_env for r in RUNTIMES.values()))


def contradictions(profile: Profile) -> list[tuple[str, str]]:
    from ddops.profile import extra_args
    return [*_speculative(profile), *_runtime(profile), *_service(profile), *_misc(profile),
            *_sglang_version(profile), *_vllm_version(profile), *extra_args.problems(profile)]


def _names(predicate) -> str:
    return "|".join(name for name, method in METHODS.items() if predicate(method))


def _speculative(profile: Profile) -> list[tuple[str, str]]:
    spec, method = profile.speculative, profile.method
    found = []
    if method.needs_draft and spec.draft_model_path is None:
        found.append(("speculative.draft_model_path",
                      f"required: method {spec.algorithm} drafts with a separate draft model"))
    if spec.draft_model_path is not None and not method.needs_draft:
        found.append(("speculative.draft_model_path", f"set, but method {spec.algorithm} uses "
                      f"no draft model (use {_names(lambda m: m.needs_draft)})"))
    if spec.ddtree_budget is not None and not method.uses_tree_budget:
        found.append(("speculative.ddtree_budget", f"set, but method {spec.algorithm} does not "
                      f"verify a tree (use {_names(lambda m: m.uses_tree_budget)})"))
    if spec.adaptive is not None and not method.is_speculative:
        found.append(("speculative.adaptive", f"set, but method {spec.algorithm} drafts nothing"))
    if spec.block_size is not None and not method.uses_block_size:
        found.append(("speculative.block_size", f"set, but method {spec.algorithm} drafts nothing"))
    return found


def _runtime(profile: Profile) -> list[tuple[str, str]]:
    runtime = RUNTIMES[profile.runtime]
    found = []
    for key in sorted(RUNTIME_KEYS):
        if runtime.flag_for(key) is None and _is_set(profile, key):
            others = [n for n, r in RUNTIMES.items() if r.flag_for(key) is not None]
            found.append((key, f"runtime {profile.runtime} has no flag for this setting "
                               f"(supported by: {', '.join(others)})"))
    if profile.sglang_version is not None and not runtime.versioned_flags:
        found.append(("sglang_version", f"set, but runtime is {profile.runtime}"))
    if profile.vllm_version is not None and runtime.extra_args_section != "vllm":
        found.append(("vllm_version", f"set, but runtime is {profile.runtime}"))
    if not runtime.serves(profile.method):
        served = [n for n, m in METHODS.items() if m.is_speculative and runtime.serves(m)]
        found.append(("speculative.algorithm", f"runtime {profile.runtime} cannot serve method "
                      f"{profile.speculative.algorithm} (it serves: {', '.join(served) or 'none'})"))
    elif not runtime.speculates(profile.method, profile.service.device):
        device = runtime.device_of(profile.service.device)
        found.append(("speculative.algorithm", f"runtime {profile.runtime} cannot run a speculative method on "
                      f"device {device} (it speculates on: {', '.join(sorted(runtime.speculates_on))}); "
                      "serve plain decoding there, or speculate with the bundled runtime"))
    for flag in runtime.flags:
        if flag.refuses and value_at(profile, flag.key) in flag.refuses:
            found.append((flag.key, f"{value_at(profile, flag.key)!r} has no {flag.flag} value in "
                          f"runtime {profile.runtime}"))
    block = runtime.flag_for("speculative.block_size")
    if (block is not None and block.style == "json" and profile.method.is_speculative
            and profile.speculative.block_size is None):
        found.append(("speculative.block_size", f"required by runtime {profile.runtime}: it drafts "
                      f"block_size {'-' if block.offset < 0 else '+'} {abs(block.offset)} tokens a round "
                      f"({block.field}) and reads no block size from the draft"))
    return found


def _service(profile: Profile) -> list[tuple[str, str]]:
    service = profile.service
    found = []
    if service.secrets.api_key_env and service.secrets.api_key_file:
        found.append(("service.secrets", "set api_key_env or api_key_file, not both"))
    found += [(f"service.environment.{name}", "reserved: the API key comes from service.secrets, "
               "never from a profile") for name in API_KEY_VARS if name in service.environment]
    return found


def _misc(profile: Profile) -> list[tuple[str, str]]:
    found = []
    if profile.cuda_graph.max_bs is not None and not profile.cuda_graph.enabled:
        found.append(("cuda_graph.max_bs", "set, but cuda_graph.enabled is false"))
    context = profile.memory.context_length
    if context is not None and profile.smoke.max_tokens >= context:
        found.append(("smoke.max_tokens", f"must be below memory.context_length ({context})"))
    return found


def _sglang_version(profile: Profile) -> list[tuple[str, str]]:
    """Settings the declared SGLang version has no flag or value for (renames are re-spelled)."""
    runtime, version = RUNTIMES[profile.runtime], profile.sglang_version
    if version is None or not runtime.versioned_flags:
        return []
    try:
        flags = flags_for(version)
    except VersionError as exc:
        return [("sglang_version", str(exc))]
    found = []
    name = profile.method.sglang_name
    if name is not None and name not in flags.algorithms:
        found.append(("speculative.algorithm", f"SGLang {version} has no --speculative-algorithm {name} "
                      f"(it accepts {', '.join(sorted(flags.algorithms))})"))
    kv = profile.memory.kv_cache_dtype
    if kv not in flags.kv_cache_dtypes:
        replaced = KV_DTYPE_RENAMES.get(kv)
        instead = f"; use {replaced[0]!r} (it rejects {kv!r} since {replaced[1]})" if replaced else ""
        found.append(("memory.kv_cache_dtype", f"SGLang {version} has no KV cache dtype {kv!r} "
                      f"(it accepts {', '.join(sorted(flags.kv_cache_dtypes))}){instead}"))
    for flag in runtime.flags:
        if flag.style == "value" and value_at(profile, flag.key) is not None:
            spelled = spell(flags, [flag.flag])[0]
            found += [(flag.key, reason) for reason in unknown_flags(flags, [spelled])]
    return found


def _vllm_version(profile: Profile) -> list[tuple[str, str]]:
    """Flags and values the targeted vLLM release's own parser does not accept (ddops.vllm)."""
    runtime = RUNTIMES[profile.runtime]
    if runtime.extra_args_section != "vllm":
        return []
    try:
        facts = vllm_versions.facts_for(profile.vllm_version)
    except vllm_versions.VersionError as exc:
        return [("vllm_version", str(exc))]
    found = []
    name = runtime.method_name(profile.method)
    if name is not None and name not in facts.methods:
        found.append(("speculative.algorithm", f"vLLM {facts.version} has no speculative method {name!r}"))
    for flag in runtime.flags:
        value = value_at(profile, flag.key)
        if not flag.flag or not _is_set(profile, flag.key):
            continue
        found += [(flag.key, reason) for reason in vllm_versions.unknown_flags(facts, [flag.flag])]
        problem = vllm_versions.bad_choice(facts, flag.flag, str(value)) if flag.style == "value" else None
        if problem:
            found.append((flag.key, problem))
    return found


def default_at(key: str) -> object:
    """The schema default of a dotted key (sections built from their own defaults)."""
    section, _, field = key.partition(".")
    section_cls = Profile.model_fields[section].annotation
    return section_cls.model_fields[field].get_default(call_default_factory=True)


def _is_set(profile: Profile, key: str) -> bool:
    return value_at(profile, key) != default_at(key)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def exposures(profile: Profile) -> list[tuple[str, str]]:
    """Valid settings that expose the service or its key, as (key, reason): warnings, not errors."""
    service, runtime = profile.service, RUNTIMES[profile.runtime]
    found = []
    if service.secrets.has_api_key and runtime.api_key_via == "config_file":
        found.append(("service.secrets", "SGLang logs its server arguments, the API key included, "
                      "to the journal when it starts: anyone who can read the journal has the key"))
    if not service.secrets.has_api_key and service.host not in LOOPBACK_HOSTS:
        found.append(("service.host", f"{service.host} with no API key: anyone who reaches port "
                      f"{service.port} can generate (set service.secrets or bind 127.0.0.1)"))
    if service.user == "root":
        found.append(("service.user", "root: the sandbox drops capabilities, but files the service "
                      "writes belong to root"))
    return found
