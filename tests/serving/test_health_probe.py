"""HealthProbe: callers share one probe at a time, and probes are at least an interval apart."""

from __future__ import annotations

import asyncio

from serving.server.generation import HealthProbe


def test_concurrent_callers_share_a_probe_and_a_loop_gets_one_answer_per_interval():
    runs = []

    async def run():
        runs.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.05)
        return {"status": "ok", "run": len(runs)}

    async def scenario():
        probe = HealthProbe(run, interval_s=0.2)
        together = await asyncio.gather(*(probe.outcome() for _ in range(50)))
        looped = [await probe.outcome() for _ in range(3)]
        return together, looped

    together, looped = asyncio.run(scenario())
    assert {body["run"] for _, body in together} == {1}            # 50 callers, one generation
    assert [body["run"] for _, body in looped] == [2, 3, 4]         # each loop turn waits for the next
    gaps = [b - a for a, b in zip(runs, runs[1:])]
    assert all(gap >= 0.2 for gap in gaps)                          # probe + interval apart, never sooner


def test_a_failing_probe_is_a_503_body():
    async def run():
        raise RuntimeError("device lost")

    status, body = asyncio.run(HealthProbe(run, interval_s=0).outcome())
    assert (status, body) == (503, {"status": "unhealthy", "reason": "device lost"})
