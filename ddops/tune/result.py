"""What a study found: one row per candidate, the winner, the tuned profile and the page.

A row's status is one of: chosen, measured, unmet (measured, failed a requirement: errors,
answers unlike production's, an SLO), pruned (stopped after its first level), not-started
(its gate failed: the deploy reverted it), skipped (the planning checks refused it, never
started), not-run (the budget or the trial count ended first).
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

from optuna.trial import TrialState

from ddops.tune.measure import level_name
from ddops.tune.plan import Plan, extends_of, write_profile
from ddops.tune.study import Reference, measured


@dataclass
class Row:
    label: str
    status: str
    objective: float | None       # x production (geometric mean over levels)
    levels: list[dict]
    accept_length: float | None
    reason: str | None
    overrides: dict
    wall_s: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def rows(plan: Plan, study) -> list[Row]:
    done = measured(study)
    found = []
    for c in plan.candidates:
        t = done.get(c.id)
        if c.skipped:
            found.append(Row(c.label, "skipped", None, [], None, c.skipped, c.overrides))
        elif t is None:
            found.append(Row(c.label, "not-run", None, [], None, None, c.overrides))
        else:
            found.append(_row(c, t))
    chosen = winner(found)
    if chosen is not None:
        chosen.status = "chosen"
    return found


def _row(c, t) -> Row:
    attrs = t.user_attrs
    wall = attrs.get("wall_s")
    if "failed" in attrs:
        return Row(c.label, "not-started", None, [], None, attrs["failed"], c.overrides, wall)
    levels, accept = attrs.get("levels", []), attrs.get("accept_length")
    if t.state == TrialState.PRUNED:
        return Row(c.label, "pruned", None, levels, accept, attrs.get("pruned"), c.overrides, wall)
    if attrs.get("unmet"):
        return Row(c.label, "unmet", attrs.get("objective"), levels, accept, "; ".join(attrs["unmet"]),
                   c.overrides, wall)
    return Row(c.label, "measured", t.value, levels, accept, None, c.overrides, wall)


def winner(found: list[Row]) -> Row | None:
    ranked = [r for r in found if r.status in ("measured", "chosen") and r.objective]
    return max(ranked, key=lambda r: r.objective) if ranked else None


def frontier(found: list[Row]) -> list[str]:
    """Labels of the measured candidates no other beats on both throughput and ITL p50 at the
    highest concurrency (the throughput/latency trade-off an operator chooses along)."""
    points = []
    for r in found:
        if r.status in ("measured", "chosen") and r.levels:
            top = r.levels[-1]
            if top.get("tokens_per_s") and top.get("itl_p50_s"):
                points.append((r.label, top["tokens_per_s"], top["itl_p50_s"]))
    return [name for name, tps, itl in points
            if not any(o_tps >= tps and o_itl <= itl and (o_tps, o_itl) != (tps, itl) for _, o_tps, o_itl in points)]


def tuned_file(plan: Plan, out: Path | None) -> Path:
    return out or plan.base_file.parent / f"{plan.base_file.stem}-tuned.yaml"


def write_tuned(plan: Plan, chosen: Row, reference: Reference, out: Path | None) -> Path:
    """The winner as `<base>-tuned.yaml`: extends the base, only the winning values, its
    figures beside production's in the comment."""
    spare = f" --on {plan.spare}" if plan.spare else ""
    lines = [f"Tuned by `ddops tune {plan.base_file.stem} --host {plan.host}{spare}` on {datetime.date.today().isoformat()} "
             f"(study {plan.study}, {plan.objective}).",
             f"{chosen.label}: {chosen.objective:.2f}x {_against(plan)} {_load(plan)}."]
    for lv in chosen.levels:
        prod = reference.level(lv["concurrency"])
        equality = "-" if lv["token_equality"] is None else f"{lv['token_equality']:.3f}"
        lines.append(f"  {level_name(lv['concurrency'])}: {_num(lv['tokens_per_s'])} tok/s "
                     f"(yardstick {_num(prod.tokens_per_s)}), ITL p50 {_ms(lv['itl_p50_s'])} "
                     f"(yardstick {_ms(prod.itl_p50_s)}), token equality with production {equality}")
    if chosen.accept_length:
        lines.append(f"  accepted length {chosen.accept_length:.2f} tokens a round")
    path = tuned_file(plan, out)
    return write_profile(path, extends_of(plan.base_file, path), chosen.overrides, lines)


def _against(plan: Plan) -> str:
    if plan.load.mirrored:
        return f"{plan.base.name} as it is (the yardstick, run as a candidate)"
    return f"production ({plan.production_unit})"


def _load(plan: Plan) -> str:
    if plan.load.mirrored:
        return (f"on {plan.load.count} of production's own requests each, mirrored from "
                f"{plan.production_unit} on {plan.host}")
    return (f"over concurrency {', '.join(map(str, plan.load.levels))}, {len(plan.load.prompts)} prompts x "
            f"{plan.load.max_tokens} tokens")


def _num(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def document(plan: Plan, found: list[Row], ran, tuned: Path | None, wall_s: float) -> dict:
    chosen = winner(found)
    counts = {}
    for r in found:
        counts[r.status] = counts.get(r.status, 0) + 1
    return {"tune": plan.to_dict(), "production": [lv.to_dict() for lv in ran.reference.levels],
            "measured_before": ran.measured_before, "started": ran.started,
            "rows": [r.to_dict() for r in found], "counts": counts,
            "chosen": chosen.to_dict() if chosen else None, "frontier": frontier(found),
            "tuned_profile": str(tuned) if tuned else None, "wall_s": round(wall_s, 1), "notes": ran.notes}


def save(plan: Plan, doc: dict) -> Path:
    plan.folder.mkdir(parents=True, exist_ok=True)
    path = plan.folder / "result.json"
    path.write_text(json.dumps(doc, indent=2, default=str))
    return path
