"""The bake's sampling cadence on a scripted clock, where each /metrics read costs time (the
real watcher against real servers: tests/rollout/test_bake_serving.py)."""

import pytest

from ddops.profile.analysis import AnalysisSpec
from ddops.rollout.fleet.bake import Endpoint, Watcher, next_mark
from ddops.rollout.fleet.scrape import Scrape

SPEC = AnalysisSpec.model_validate({"interval_s": 5.0, "min_requests": 4, "baseline": "unchanged",
                                    "checks": [{"metric": "error_ratio", "max": 0.1}]})
HOSTS, UNCHANGED = ["h1", "h2"], ["h3"]  # three /metrics reads per sample


class Clock:
    """Time moves only when the watcher sleeps or reads a host (`read_s` per read)."""

    def __init__(self, read_s: float) -> None:
        self.now, self.read_s, self.reads, self.wakes = 0.0, read_s, 0, []

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.wakes.append(self.now)

    def read(self, base_url: str, api_key: str | None = None) -> Scrape:
        self.now += self.read_s
        self.reads += 1
        return Scrape("bundled", self.now, requests=10.0 * self.reads)  # a healthy, busy host


def bake(read_s: float, bake_s: float = 30.0):
    """(verdicts, sampling times and the bake's end, both from the bake's start)."""
    clock, samples = Clock(read_s), []
    endpoints = {h: Endpoint(f"http://{h}", "m") for h in HOSTS + UNCHANGED}
    watcher = Watcher(SPEC, bake_s, endpoints, lambda host, kind, data: samples.append(kind),
                      read=clock.read, sleep=clock.sleep, clock=lambda: clock.now)
    verdicts = watcher.bake(HOSTS, UNCHANGED)
    began = 3 * read_s  # after the start reads
    assert samples.count("sample") == 2 * len(clock.wakes)  # one sample per host per wake
    return verdicts, [round(t - began, 6) for t in clock.wakes], round(clock.now - began, 6)


@pytest.mark.parametrize("read_s", [0.0, 0.4, 1.5])
def test_reads_shorter_than_the_interval_shift_no_sample_and_do_not_stretch_the_bake(read_s):
    verdicts, wakes, ended = bake(read_s)  # up to 4.5 s of reading in each 5 s interval
    assert verdicts["h1"]["status"] == verdicts["h2"]["status"] == "passed"
    assert wakes == [5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
    assert ended == pytest.approx(30.0 + 3 * read_s)  # the last mark's reads, nothing more


def test_a_read_longer_than_the_interval_skips_the_marks_it_ran_past():
    verdicts, wakes, ended = bake(read_s=2.0)  # 6 s of reading per sample
    assert verdicts["h1"]["status"] == "passed"
    assert wakes == [5.0, 15.0, 25.0, 31.0] and ended == 37.0  # the end mark (30) is still sampled


def test_marks_are_multiples_of_the_interval_then_the_bake_end():
    assert [next_mark(t, 5.0, 12.0) for t in (0.0, 4.9, 5.0, 5.3, 9.99, 10.0, 11.0)] == \
        [5.0, 5.0, 10.0, 10.0, 10.0, 12.0, 12.0]
    assert next_mark(0.1 * 7, 0.1, 1.0) == pytest.approx(0.8)  # 0.7 / 0.1 is 6.999...: not sampled twice
    assert next_mark(40.0, 5.0, 30.0) == 30.0  # past the end: one sample more, then the bake stops
