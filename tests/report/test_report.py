"""`ddops report`: self-contained HTML for shadow comparisons and rollouts, checked as text
and opened in a real headless Chromium (the Debian package, driven by Playwright)."""

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddops.cli import app
from ddops.report.shadow_page import first_difference
from tests.report.results import rollout_doc, shadow_doc

CHROMIUM = shutil.which("chromium")
# A real `ddops tune` result: vLLM candidates on a lab host beside bundled production (docs/tune.md)
TUNE = Path(__file__).parent / "data" / "tune.json"
CHARTS = {"shadow": 2, "rollout": 2, "tune": 1}


@pytest.fixture
def reports(tmp_path):
    paths = {}
    for name, doc in (("shadow", shadow_doc()), ("rollout", rollout_doc(tmp_path / "state")),
                      ("tune", json.loads(TUNE.read_text()))):
        result = tmp_path / f"{name}.json"
        result.write_text(json.dumps(doc))
        printed = CliRunner().invoke(app, ["report", str(result)])
        assert printed.exit_code == 0, printed.output
        paths[name] = tmp_path / f"{name}.html"
        assert printed.output.strip() == str(paths[name])
    return paths


def test_pages_are_self_contained(reports):
    for path in reports.values():
        page = path.read_text()
        assert "<script" not in page and "src=" not in page and "@import" not in page
        # references only inside the page (SVG clip paths and glyphs)
        assert all(ref.startswith("#") for ref in re.findall(r'href="([^"]*)"', page))
        assert all(ref.startswith("#") for ref in re.findall(r"url\(([^)]*)\)", page))


def test_shadow_page_shows_the_first_difference_in_context(reports):
    page = reports["shadow"].read_text()
    assert "4 of 24 prompts" not in page and "20 of 24 prompts identical" in page
    assert "<mark>&#x27;Fizz&#x27;)</mark>" in page  # the shadow's side from where it differs
    assert "<mark>i)</mark>" in page  # production's side
    assert page.count("<svg") == 2


def test_rollout_page_has_timeline_and_analysis_per_watched_host(reports):
    page = reports["rollout"].read_text()
    assert "Rollout of p: halted" in page and "Analysis of h1" in page
    assert "error_ratio 0.5 &gt; max 0.1" in page
    assert page.count("<svg") == 2  # the timeline and h1's samples (h2, h3 never deployed)


def test_tune_page_names_the_choice_the_frontier_and_why_candidates_did_not_start(reports):
    page = reports["tune"].read_text()
    assert "Chosen: algorithm=none max_running_requests=16" in page and "0.93x production" in page
    assert page.count("<svg") == 1       # the throughput/latency frontier
    # both DFlash candidates, in the candidates table and again with their gate's reason
    assert page.count("not-started") == 4 and page.count("speculation accepted nothing") == 2


def test_first_difference():
    assert first_difference("abc", "abc") is None
    assert first_difference("abcd", "abXd") == 2
    assert first_difference("ab", "abc") == 2


def test_not_a_result_is_bad_input(tmp_path):
    odd = tmp_path / "odd.json"
    odd.write_text('{"hello": 1}')
    result = CliRunner().invoke(app, ["report", str(odd)])
    assert result.exit_code == 2 and "not a shadow comparison, rollout or tune result" in result.output
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package chromium missing (make setup installs it)")
@pytest.mark.parametrize("name", ["shadow", "rollout", "tune"])
def test_report_renders_in_headless_chromium(reports, name, tmp_path):
    from playwright.sync_api import sync_playwright
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: problems.append(f"fetched {r.url}") if not r.url.startswith("file:") else None)
            page.goto(reports[name].as_uri())
            charts = page.locator("figure.chart svg")
            assert charts.count() == CHARTS[name]
            for i in range(charts.count()):
                box = charts.nth(i).bounding_box()
                assert box and box["width"] > 300 and box["height"] > 100  # drawn, not collapsed
            assert page.locator("table").count() >= 2
            shot = tmp_path / f"report-{name}.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert shot.stat().st_size > 10_000
    print(f"\nscreenshot: {shot}")
