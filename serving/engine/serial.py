"""A one-sequence `Decoder` (docs/contracts.md section 3) as a scheduler runner: one at a time.

Used for decoders that hold the state of a single sequence (test doubles, models the batch
runner does not support); the scheduler then runs exactly what the old one-request engine ran.
"""

from __future__ import annotations


class SerialRunner:
    max_running = 1

    def __init__(self, decoder):
        self.decoder = decoder

    def admit(self, seq) -> bool:
        return True

    def prefill(self, seqs, budget: int) -> list[list[int]]:
        out = []
        for seq in seqs:
            out.append(self.decoder.start(seq.prompt, seq.request.sampling, seq.request.rule.max_new_tokens))
            seq.prefilled = len(seq.prompt)
        return out

    def decode(self, seqs) -> list[list[int]]:
        for seq in seqs:
            if seq.request.probe and seq.rounds == 0:
                self.decoder.force_speculation()
        return [self.decoder.step() for _ in seqs]

    def release(self, seq) -> None:
        pass
