"""`ddops shadow compare --mirrored`: judge what production mirrored to the shadow, print, exit."""

from __future__ import annotations

from pathlib import Path

from ddops import exits
from ddops.rollout.output import Output


def compare_mirrored(production_url: str | None, shadow_url: str | None, profile: str | None,
                     results_dir: Path | None, inventory: Path | None, out: Output) -> None:
    import typer

    from ddops.report.build import write_report
    from ddops.rollout.shadow import tables
    from ddops.rollout.shadow.lifecycle import run_mirrored

    def body() -> int:
        out.event("stage", "reading production's tap and the shadow's comparison of mirrored requests")
        result, verdict, path, prod, cand = run_mirrored(
            production_url=production_url, shadow_url=shadow_url, profile_name=profile,
            results_dir=results_dir, inventory=inventory)
        out.show(tables.mirrored_table(result))
        out.show(tables.verdict_table(verdict))
        out.event("stage", f"results saved to {path}")
        report = write_report(path)
        out.event("stage", f"report: {report}", report_file=str(report))
        doc = {"production_url": prod.url, "shadow_url": cand.url, "comparison": result.to_dict(),
               "verdict": verdict.to_dict(), "results_file": str(path), "report_file": str(report)}
        return out.finish(exits.OK if verdict.passed else exits.FAILED, doc,
                          meaning="verdict passed" if verdict.passed else "verdict failed")

    raise typer.Exit(body())
