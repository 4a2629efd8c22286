"""`ddops fit PROFILE [--gpu KIND | --gpu-mem-gib N] [--tp N] [--host NAME] [--json]`.

Reads the target and draft config.json (+ safetensors headers) on this machine, from copies
(--models DIR), or on the host over SSH (--host, which also checks the rendered flags against
the host's installed SGLang), and predicts per GPU whether the profile fits. Exit 0 fits,
1 does not fit (or a flag the host's SGLang lacks), 2 bad input (unknown GPU, unreadable configs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ddops import exits
from ddops.commands.profiles import DebugOpt, InventoryOpt, JsonOpt, ProfilesDir, out
from ddops.fit import (GpuKind, Models, find_gpu, gpu_from_gib, host_gpu, local_reader, needs_gpu, read_models,
                       remote_reader)
from ddops.fit.bundled import BundledFit
from ddops.fit.gpus import known_names
from ddops.fit.memory_models import Prediction, host_memory_reader, predict, sizes_from_host_memory
from ddops.fit.model import ModelFactsError
from ddops.fit.runtime_version import FlagCheck, check_flags, installed_version
from ddops.fit.shape import bounded_window, kv_head_notes
from ddops.fit.start_rules import target_refusals
from ddops.fit.verdict import Assessment, gib
from ddops.fit.vllm_fit import VllmAssessment
from ddops.profile.extra_args import memory_warnings
from ddops.inventory import load_inventory
from ddops.draft_pairing import PreflightError
from ddops.profile import RUNTIMES, ConfigError, load_profile

from ddops.remote import connect
from ddops.shell import print_json

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = exits.OK, exits.FAILED, exits.BAD_INPUT
MEANING = {EXIT_FITS: "fits", EXIT_DOES_NOT_FIT: "does not fit"}
ModelsOpt = Annotated[Optional[Path], typer.Option(
    "--models", envvar="DDOPS_FIT_MODELS",
    help="Read checkpoints from DIR/<basename of each model path> instead of the paths.")]


def register(app: typer.Typer) -> None:
    app.command("fit")(cmd_fit)


def cmd_fit(profile: Annotated[str, typer.Argument(help="Profile name or YAML path.")],
            gpu: Annotated[Optional[str], typer.Option("--gpu", help=f"GPU kind ({known_names()}).")] = None,
            gpu_mem_gib: Annotated[Optional[float], typer.Option(
                "--gpu-mem-gib", min=1, help="GPU memory in GiB, for a card not in the table.")] = None,
            tp: Annotated[Optional[int], typer.Option("--tp", min=1, help="Override model.tp_size.")] = None,
            host: Annotated[Optional[str], typer.Option(
                "--host", help="Read models over SSH on this inventory host; its GPU unless --gpu.")] = None,
            models: ModelsOpt = None, profiles_dir_: ProfilesDir = None, inventory: InventoryOpt = None,
            as_json: JsonOpt = False, debug: DebugOpt = False) -> None:
    """Predict whether a profile fits its GPUs: weights, KV pool, hybrid state, fraction window."""
    resolved = load_profile(profile, profiles_dir_)
    target_host = load_inventory(inventory).host(host) if host else None
    card = _gpu(gpu, gpu_mem_gib, target_host)
    if card is None and needs_gpu(resolved):
        raise ConfigError(["fit: say which GPU: --gpu KIND, --gpu-mem-gib N, or --host NAME "
                           "with a gpu in the inventory"])
    if sizes_from_host_memory(resolved) and (target_host is None or models is not None):
        raise ConfigError([f"fit {resolved.name}: SGLang's CPU engine sizes its pool from the host's free RAM "
                           "when it starts: pass --host NAME (without --models)"])
    loaded, flags, memory = _models(resolved, target_host, models)
    refused = target_refusals(resolved, loaded.target)
    if refused:
        raise ConfigError([f"fit {resolved.name}: sglang.extra_args {line}" for line in refused])
    if sizes_from_host_memory(resolved) and memory is None:
        raise ConfigError([f"fit {resolved.name}: {target_host.name}: /proc/meminfo could not be read"])
    prediction = predict(resolved, card, loaded, tp, memory)
    if prediction.shape_refused:
        raise ConfigError([f"fit {resolved.name}: {line}" for line in prediction.reasons])
    code = exit_code(prediction, flags)
    REPORTS[type(prediction.assessment)](resolved, prediction.assessment, loaded, flags, code, as_json)
    raise typer.Exit(code)


def exit_code(prediction: Prediction, flags: FlagCheck | None) -> int:
    """The one mapping: fits (and every rendered flag is one the host's SGLang knows) or not."""
    return EXIT_FITS if prediction.fits and not (flags and flags.problems) else EXIT_DOES_NOT_FIT


def _gpu(kind: str | None, memory_gib: float | None, host) -> GpuKind | None:
    if kind and memory_gib:
        raise ConfigError(["fit: --gpu and --gpu-mem-gib: give one of them"])
    if kind:
        found = find_gpu(kind)
        if found is None:
            raise ConfigError([f"fit: --gpu {kind!r}: unknown GPU kind (known: {known_names()}; "
                               f"or give --gpu-mem-gib N)"])
        return found
    if memory_gib:
        return gpu_from_gib(memory_gib)
    return host_gpu(host) if host is not None else None


def _models(profile, host, models_dir: Path | None) -> tuple[Models, FlagCheck | None, object]:
    """The checkpoints' facts; on a host also its SGLang version against the rendered flags, and
    for a runtime that sizes its pool from the host's memory (the bundled one on CPU), that memory."""
    try:
        if host is not None and models_dir is None:
            with connect(host) as remote:
                models = read_models(profile, remote_reader(remote))
                read_memory = host_memory_reader(profile)
                memory = read_memory(remote, profile.service.unit) if read_memory else None
                if not RUNTIMES[profile.runtime].versioned_flags:
                    return models, None, memory
                return models, check_flags(profile, installed_version(remote, profile.service.python)), memory
        return read_models(profile, local_reader(models_dir)), None, None
    except (PreflightError, ModelFactsError) as exc:    # an unreachable host escapes: exit 6
        where = f"on {host.name}" if host is not None and models_dir is None else "locally"
        raise ConfigError([f"fit: cannot read the model configs {where}: {exc}"]) from None


def _report_pools(profile, a: Assessment, models: Models, flags: FlagCheck | None, code: int, as_json: bool) -> None:
    """SGLang: its pools per GPU, the verdict, the host's SGLang against the rendered flags."""
    notes = kv_head_notes(models.target, models.draft) + memory_warnings(profile)
    if as_json:
        print_json(code, meaning=MEANING[code], **as_dict(profile.name, a, models), sglang=_flags_dict(flags),
                   notes=notes)
        return
    _print(profile.name, a, models)
    _print_flags(flags)
    for line in notes:
        out.print(f"  note: {line}", markup=False, style="yellow")


def as_dict(name: str, a: Assessment, models: Models) -> dict:
    s, p, v = a.setup, a.pools, a.verdict
    return {
        "profile": name, "fits": v.fits, "headline": v.headline, "reasons": list(v.reasons),
        "warnings": list(v.warnings), "suggestions": list(v.suggestions),
        "gpu": {"kind": s.gpu.name, "memory_mib": s.gpu.memory_mib, "count": s.tp},
        "mem_fraction_static": p.fraction, "fraction_is_default": p.fraction_is_default,
        "window": bounded_window(*p.window),
        "min_viable_fraction": round(p.min_viable, 4), "context_length": s.context_length,
        "kv_pool_tokens": p.kv_tokens, "one_request_fits": p.one_request_fits,
        "full_length_requests": p.full_length_requests, "max_running_requests": p.max_running_requests,
        "per_gpu_bytes": {
            "capacity": p.capacity, "free_before_load": p.pre, "weights": p.weights,
            "target_weights": p.target_weights, "draft_weights": p.draft_weights,
            "runtime_reserve": p.reserve, "headroom": p.headroom, "token_table": p.token_table,
            "kv_per_token": p.cell, "draft_kv_per_token": p.draft_cell,
            "mamba_state_per_slot": p.mamba_slot, "mamba_spec_states": p.mamba_spec,
            "mamba_total": p.mamba_bytes, "kv_pool": p.kv_budget},
        "mamba_slots": p.mamba_slots,
        "models": {role: _model_dict(m) for role, m in (("target", models.target), ("draft", models.draft)) if m},
    }


def _flags_dict(flags: FlagCheck | None) -> dict | None:
    if flags is None:
        return None
    return {"host_version": flags.host_version, "declared": flags.declared, "problems": list(flags.problems),
            "notes": list(flags.notes)}


def _print_flags(flags: FlagCheck | None) -> None:
    if flags is None:
        return
    out.print(f"SGLang on the host: {flags.host_version or 'not installed'}"
              + (f" (profile declares {flags.declared})" if flags.declared else ""), markup=False)
    for line in flags.problems:
        out.print(f"  [red]flag problem:[/] {escape(line)}")
    for line in flags.notes:
        out.print(f"  note: {line}", markup=False, style="yellow")


def _model_dict(m) -> dict:
    return {"path": m.path, "architecture": m.architecture, "params": m.params,
            "params_source": m.params_source, "dtype": m.dtype}


def _print(name: str, a: Assessment, models: Models) -> None:
    s, p, v = a.setup, a.pools, a.verdict
    out.print(f"fit {name} on {s.tp} x {s.gpu.name} ({s.gpu.memory_mib:,} MiB each)", style="bold")
    _print_table_and_verdict("per GPU", _rows(s, p, models), v)


def _print_table_and_verdict(title: str, rows: list[tuple[str, str]], v) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for label, value in rows:
        table.add_row(label, value)
    out.print(table)
    out.print(f"[{'green' if v.fits else 'red'}]{escape(v.headline)}[/]")
    for line in v.reasons:
        out.print(f"  because {line}", markup=False)
    for line in v.warnings:
        out.print(f"  note: {line}", markup=False, style="yellow")
    for line in v.suggestions:
        out.print(f"  try: {line}", markup=False)


def _rows(s, p, models: Models) -> list[tuple[str, str]]:
    bounded = bounded_window(*p.window)
    window = f"{bounded['min']:.3f} - {bounded['max']:.3f}" if bounded["exists"] else "none"
    rows = [("weights (target)", f"{gib(p.target_weights)} ({models.target.params_source})"),
            ("weights (draft)", gib(p.draft_weights)),
            ("KV bytes per token", f"{p.cell:,} (draft {p.draft_cell:,})"),
            ("runtime reserve", gib(p.reserve)),
            ("mem-fraction-static", f"{p.fraction:.3f}" + (" (SGLang default)" if p.fraction_is_default else "")),
            ("headroom", gib(p.headroom))]
    if p.mamba_slot:
        rows += [("hybrid state per slot", gib(p.mamba_slot)), ("hybrid verify states", gib(p.mamba_spec)),
                 ("hybrid slots", str(p.mamba_slots))]
    pool = gib(p.kv_tokens * p.cell) + " (capped by --max-total-tokens)" if s.max_total_tokens \
        and p.kv_tokens == s.max_total_tokens else gib(max(p.kv_budget, 0))
    return rows + [("KV pool", f"{pool} = {p.kv_tokens:,} tokens"),
                   ("context-length", f"{s.context_length:,}"),
                   ("full-length requests at once", str(p.full_length_requests)),
                   ("fractions that work", window),
                   ("minimum viable (weights only)", f"{p.min_viable:.3f}")]


def _report_exact(profile, fit: BundledFit, models: Models, flags: FlagCheck | None, code: int,
                  as_json: bool) -> None:
    """A runtime that preallocates everything: the total against the card (or no GPU at all)."""
    predicted, card = fit.memory, fit.card
    where = f"{card.name} ({gib(fit.usable_bytes)} usable)" if card else "CPU (host memory, not checked)"
    if as_json:
        print_json(code, meaning=MEANING[code], profile=profile.name, runtime=profile.runtime, fits=fit.fits,
                   gpu=card.name if card else None, memory=predicted.as_dict())
        return
    out.print(f"fit {profile.name}: {profile.runtime} runtime on {where} will allocate "
              f"{gib(predicted.predicted_bytes)}: weights {gib(predicted.weights_bytes)} in "
              f"{predicted.dtype}, KV cache {gib(predicted.kv_cache_bytes)} for "
              f"{predicted.kv_slots:,} slots"
              + (f" (+ the draft's {predicted.draft_kv_slots:,})" if predicted.draft_kv_slots else "")
              + (f", linear-attention state {gib(predicted.state_cache_bytes)}" if predicted.state_cache_bytes else "")
              + (f", prefix cache {gib(predicted.prefix_cache_bytes)}" if predicted.prefix_cache_bytes else ""),
              markup=False)
    if predicted.pool:
        out.print(f"  pool: {pool_rule_line(predicted.pool, predicted.kv_slots)}", markup=False)
    out.print("[green]fits[/]" if fit.fits else "[red]does not fit[/]")


def pool_rule_line(rule, rows: int) -> str:
    """How the runtime's start-up rule gives `rows`, and whether fit knew every figure it needs."""
    line = f"{rule.max_running} running x {rule.sequence_rows:,} rows (context + verify)"
    if rule.memory_bytes is not None:
        line += f", capped at {rule.fraction:g} of {gib(rule.memory_bytes)} ({rule.memory_source}) less the rest"
    if rule.cap:
        line += f", --max-total-tokens {rule.cap:,}"
    line += f" -> {rows:,} rows"
    if not rule.exact:
        line += (f"; the host's memory is not known here (give --host): the runtime caps this at "
                 f"{rule.fraction:g} of it less the rest, never below {rule.sequence_rows:,}")
    return line


def _report_blocks(profile, a: VllmAssessment, models: Models, flags: FlagCheck | None, code: int,
                   as_json: bool) -> None:
    """vLLM: its KV budget in blocks (estimates labelled), then the verdict."""
    s, p, v = a.setup, a.plan, a.verdict
    if as_json:
        print_json(code, meaning=MEANING[code], profile=profile.name, runtime=profile.runtime,
                   fits=v.fits, headline=v.headline, reasons=list(v.reasons), warnings=list(v.warnings),
                   suggestions=list(v.suggestions), **_blocks_dict(s, p))
        return
    where = f"{s.tp} x {s.gpu.name} ({s.gpu.memory_mib:,} MiB each)" if s.gpu else "CPU"
    out.print(f"fit {profile.name}: vLLM on {where}", style="bold", markup=False)
    _print_table_and_verdict("per GPU" if s.gpu else "KV cache", _block_rows(s, p), v)


def _block_rows(s, p) -> list[tuple[str, str]]:
    rows = []
    if s.gpu:
        rows += [("gpu-memory-utilization", f"{s.utilization}" + (" (vLLM default)" if s.utilization_is_default else "")),
                 ("requested", gib(p.requested)), ("weights (target)", gib(p.target_weights)),
                 ("weights (draft)", gib(p.draft_weights)),
                 (f"activation peak at {s.batched_tokens:,} tokens (estimate)", gib(p.activation)),
                 ("non-torch memory (estimate)", gib(p.non_torch)),
                 ("CUDA graphs (estimate)" if s.cuda_graphs else "CUDA graphs (--enforce-eager)", gib(p.cuda_graphs))]
    else:
        rows += [("VLLM_CPU_KVCACHE_SPACE", gib(p.capacity) if s.cpu_kv_bytes is not None else "not set")]
    rows += [("KV cache", gib(p.available)), ("block size", f"{p.block_size} tokens"),
             ("page (one layer, one block)", f"{p.buckets[0].page:,} B" if p.buckets else "-")]
    rows += [(f"  {b.kind}", f"{b.layers} layers x {b.per_request} pages a request") for b in p.buckets]
    return rows + [("blocks", f"{p.num_blocks:,} of {p.bytes_per_block:,} B"),
                   ("one max_model_len request", f"{gib(p.needed)} ({s.max_model_len:,} tokens)"),
                   ("KV cache tokens", f"{p.kv_tokens:,} ({p.concurrency:.2f}x max_model_len)")]


def _blocks_dict(s, p) -> dict:
    return {"device": s.device, "gpu": {"kind": s.gpu.name, "memory_mib": s.gpu.memory_mib, "count": s.tp} if s.gpu else None,
            "gpu_memory_utilization": s.utilization, "max_model_len": s.max_model_len,
            "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.batched_tokens,
            "block_size": p.block_size, "num_blocks": p.num_blocks, "kv_cache_tokens": p.kv_tokens,
            "max_concurrency": round(p.concurrency, 2), "one_request_fits": p.one_request_fits,
            "estimated": ["activation_peak", "non_torch", "cuda_graphs"] if s.gpu else [],
            "per_gpu_bytes" if s.gpu else "bytes": {
                "capacity": p.capacity, "requested": p.requested, "target_weights": p.target_weights,
                "draft_weights": p.draft_weights, "activation_peak": p.activation, "non_torch": p.non_torch,
                "cuda_graphs": p.cuda_graphs, "kv_cache": p.available, "bytes_per_block": p.bytes_per_block,
                "one_request": p.needed},
            "layers": [{"kind": b.kind, "layers": b.layers, "page_bytes": b.page, "pages_per_request": b.per_request}
                       for b in p.buckets]}


# what `predict` returned -> how it is shown (the command prints; the fit module decided)
REPORTS = {BundledFit: _report_exact, VllmAssessment: _report_blocks, Assessment: _report_pools}
