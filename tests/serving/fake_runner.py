"""A runner that does no model work, for fast unit tests of the engine and the server around it
(the real runner is tested beside them: tests/serving/test_engine.py, test_batching.py).

A subclass answers `start(prompt_ids, sampling, max_new_tokens) -> [first token]` for a prompt
and `step() -> tokens` for each round, one sequence at a time."""

from __future__ import annotations

from serving.engine.runner import RunnerInfo


class FakeRunner:
    max_running = 1

    def fits(self, prompt_tokens: int, max_new_tokens: int) -> bool:
        return True

    def admit(self, seq) -> bool:
        return True

    def prefill(self, seqs, chunk: int) -> list[list[int]]:
        out = []
        for seq in seqs:
            out.append(self.start(seq.prompt, seq.request.sampling, seq.request.rule.max_new_tokens))
            seq.prefilled = len(seq.prompt)
        return out

    def decode(self, seqs) -> list[list[int]]:
        return [self.step() for _ in seqs]

    def release(self, seq) -> None:
        pass

    def info(self) -> RunnerInfo:
        return RunnerInfo(speculative={}, kv_rows=0, kv_used=0, prefix_cache=False, prefix_hit_rate=0.0,
                          memory={"weights_bytes": 0, "kv_cache_bytes": 0, "state_cache_bytes": 0,
                                  "prefix_cache_bytes": 0}, kernels={})
