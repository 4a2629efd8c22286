"""The bake's SGLang row on a real scrape of SGLang 0.5.15's CPU engine (tests/rollout/data,
taken after two chats and one streamed chat; the live scrape is read in
tests/deploy/test_lab_sglang.py)."""

from pathlib import Path

from ddops.rollout.fleet import scrape

REAL = Path(__file__).parent / "data" / "sglang-0.5.15-cpu.metrics"


def test_a_real_sglang_scrape_gives_every_figure_the_bake_reads():
    read = scrape.parse(REAL.read_text(), at=0.0)
    figures = read.summary()
    assert read.runtime == "sglang"
    assert (figures["requests"], figures["errors"], read.generated) == (3.0, 0.0, 32.0)
    assert all(figures[f"{h}_p50"] > 0 for h in ("ttft", "itl", "e2e")), figures


def test_families_sglang_creates_lazily_read_as_zero():
    """No abort yet: sglang:num_aborted_requests_total is absent, not an error."""
    text = REAL.read_text()
    assert "sglang:num_aborted_requests_total" not in text
    assert scrape.parse(text, at=0.0).errors == 0.0
