"""The Grafana dashboard `ddops monitor render` writes (Grafana is not in the registries here, so
its structure is checked): import-ready JSON whose every panel plots a series the rendered
rules record, over the operator's Prometheus chosen by a datasource variable."""

from __future__ import annotations

import json

from ddops.monitor import render, rules


def test_the_dashboard_is_import_ready_and_plots_only_recorded_series(tmp_path):
    render.write(tmp_path, [])
    board = json.loads((tmp_path / "dashboard.json").read_text())
    assert board["uid"] == "ddops-speculative" and isinstance(board["schemaVersion"], int)
    [variable] = board["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == ("datasource", "datasource", "prometheus")
    recorded = {rule.record for rule in rules.joined()}
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels) and panels
    cells = set()
    for panel in panels:
        assert panel["type"] == "timeseries" and panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert grid["w"] + grid["x"] <= 24 and (grid["x"], grid["y"]) not in cells     # Grafana's 24 columns, no overlap
        cells.add((grid["x"], grid["y"]))
        for target in panel["targets"]:
            assert target["expr"] in recorded, f"{panel['title']}: {target['expr']} is recorded by no rule"
            assert "{{host}}" in target["legendFormat"]
    plotted = {t["expr"] for p in panels for t in p["targets"]}
    assert {"ddops:accept_length:rate5m", "ddops:tokens_per_second:rate5m", "ddops:error_ratio:rate5m"} <= plotted
