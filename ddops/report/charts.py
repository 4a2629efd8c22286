"""Charts as inline SVG, drawn by matplotlib (Agg, no display, no network).

Each function takes plain data and returns one `<svg>` element as text; the SVG carries its
own fonts as paths, so the page renders the same everywhere.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

COLOURS = {"production": "#4c72b0", "shadow": "#dd8452", "baseline": "#8c8c8c",
           "fail": "#c44e52", "pass": "#55a868", "wait": "#b0b0b0"}
plt.rcParams.update({"svg.fonttype": "path", "font.size": 9, "axes.spines.top": False,
                     "axes.spines.right": False})


def svg(figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: inline in HTML


def distributions(series: dict[str, dict[str, list[float]]], title: str) -> str:
    """One panel per measure (e.g. latency, TTFT), each endpoint's values as a histogram.
    series: measure -> endpoint -> values in seconds."""
    figure, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 2.8), squeeze=False,
                                layout="constrained")
    for axis, (measure, by_endpoint) in zip(axes[0], series.items()):
        values = [v for vs in by_endpoint.values() for v in vs]
        bins = _bins(values)
        for endpoint, vs in by_endpoint.items():
            if vs:
                axis.hist(vs, bins=bins, alpha=0.6, label=f"{endpoint} (n={len(vs)})",
                          color=COLOURS.get(endpoint))
        axis.set_xlabel(f"{measure} (s)")
        axis.set_ylabel("requests")
        axis.legend(frameon=False)
    figure.suptitle(title)
    return svg(figure)


def _bins(values: list[float], count: int = 20) -> list[float] | int:
    if not values or max(values) == min(values):
        return count
    low, high = min(values), max(values)
    step = (high - low) / count
    return [low + i * step for i in range(count + 1)]


def bars(figures: dict[str, dict[str, float | None]], title: str) -> str:
    """Side-by-side bars per measure. figures: measure -> endpoint -> value (None: absent)."""
    figure, axes = plt.subplots(1, len(figures), figsize=(2.6 * len(figures), 2.8), squeeze=False,
                                layout="constrained")
    for axis, (measure, by_endpoint) in zip(axes[0], figures.items()):
        names = list(by_endpoint)
        values = [by_endpoint[n] or 0.0 for n in names]
        drawn = axis.bar(names, values, color=[COLOURS.get(n, "#777") for n in names])
        axis.bar_label(drawn, labels=[f"{by_endpoint[n]:.3g}" if by_endpoint[n] is not None else "n/a"
                                      for n in names])
        axis.set_title(measure)
    figure.suptitle(title)
    return svg(figure)


def samples(host: str, rows: list[dict], checks: list[dict]) -> str:
    """One panel per checked metric: the host's window value per sample (coloured by the
    sample's verdict), the baseline's (dashed) and the absolute bounds (dotted).
    rows: {t, verdict, window, baseline}; checks: the plan's check specs."""
    metrics = list(dict.fromkeys(c["metric"] for c in checks)) or ["error_ratio"]
    figure, axes = plt.subplots(1, len(metrics), figsize=(3.6 * len(metrics), 2.8), squeeze=False,
                                layout="constrained")
    for axis, metric in zip(axes[0], metrics):
        points = [(r["t"], (r.get("window") or {}).get(metric), r["verdict"]) for r in rows]
        shown = [(t, v, verdict) for t, v, verdict in points if v is not None]
        axis.plot([t for t, _, _ in shown], [v for _, v, _ in shown], color="#333", lw=1)
        axis.scatter([t for t, _, _ in shown], [v for _, v, _ in shown], zorder=3,
                     c=[COLOURS.get(verdict, "#777") for _, _, verdict in shown])
        base = [(r["t"], (r.get("baseline") or {}).get(metric)) for r in rows]
        base = [(t, v) for t, v in base if v is not None]
        if base:
            axis.plot([t for t, _ in base], [v for _, v in base], ls="--", color=COLOURS["baseline"],
                      label="baseline")
            axis.legend(frameon=False)
        for check in checks:
            for key in ("max", "min"):
                if check["metric"] == metric and check.get(key) is not None:
                    axis.axhline(check[key], ls=":", color=COLOURS["fail"])
        axis.set_title(metric)
        axis.set_xlabel("s into the bake")
    figure.suptitle(f"{host}: analysis samples")
    return svg(figure)


def timeline(lanes: dict[str, list[tuple[float, float, str]]], marks: list[tuple[float, str]]) -> str:
    """Per-host lanes of (start, end, status) spans in seconds since the rollout began, and
    rollout events as labelled vertical lines."""
    figure, axis = plt.subplots(figsize=(9, 0.6 * max(2, len(lanes)) + 1.0))
    palette = {"running": "#8172b3", "done": COLOURS["pass"], "failed": COLOURS["fail"], "refused": COLOURS["fail"],
               "reverted": COLOURS["baseline"], "revert-failed": "#000", "locked": "#937860",
               "pending": "#eeeeee"}
    total = max([end for spans in lanes.values() for _, end, _ in spans] + [at for at, _ in marks] + [1e-3])
    for row, (host, spans) in enumerate(lanes.items()):
        for start, end, status in spans:
            axis.broken_barh([(start, max(end - start, total * 0.004))], (row - 0.35, 0.7),
                             color=palette.get(status, "#999"))
            axis.text(start, row, f" {status}", va="center", fontsize=7)
    for at, label in marks:
        axis.axvline(at, color="#555", lw=0.8, ls=":")
        axis.text(at, len(lanes) - 0.4, label, rotation=90, va="bottom", fontsize=7)
    axis.set_yticks(range(len(lanes)), list(lanes))
    axis.set_ylim(-0.6, len(lanes) + 1.2)
    axis.invert_yaxis()
    axis.set_xlabel("seconds since the rollout started")
    return svg(figure)


def frontier(points: list[tuple[str, float, float, bool]], production: tuple[float, float] | None,
             title: str) -> str:
    """Throughput against ITL p50: points (label, tok/s, ITL seconds, on the frontier)."""
    figure, axis = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    for label, tps, itl, best in points:
        axis.scatter([itl * 1000], [tps], color=COLOURS["pass"] if best else COLOURS["wait"], zorder=3)
        axis.annotate(label, (itl * 1000, tps), fontsize=7, xytext=(4, 3), textcoords="offset points")
    if production:
        axis.scatter([production[1] * 1000], [production[0]], color=COLOURS["production"], marker="s",
                     label="production", zorder=3)
        axis.legend(frameon=False)
    axis.set_xlabel("ITL p50 (ms)")
    axis.set_ylabel("tokens/s")
    figure.suptitle(title)
    return svg(figure)
