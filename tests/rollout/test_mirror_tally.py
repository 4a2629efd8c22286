"""The shadow's tally of mirrored records (serving.server.mirror_tally): pure, milliseconds."""

from serving.engine.stats import Usage
from serving.server.mirror_tally import MAX_REASONS, MAX_SAMPLES, WINDOW, Tally, redact


def usage(tokens: int, rounds: int = 2, accepted: int = 6) -> Usage:
    return Usage(prompt_tokens=4, completion_tokens=tokens, rounds=rounds, accepted=accepted,
                 ttft_s=0.01, total_s=0.01 + 0.002 * (tokens - 1))


def test_deterministic_answers_compare_as_common_prefix_of_ids():
    tally = Tally()
    assert tally.add(True, (1, 2, 3, 4), "length", (1, 2, 3, 4), "length", usage(4))
    assert not tally.add(True, (1, 2, 3, 4), "length", (1, 2, 9, 4, 5), "length", usage(5))
    det = tally.to_dict()["deterministic"]
    assert det == {"requests": 2, "equal": 1, "matched_tokens": 6, "compared_tokens": 9,
                   "token_equality": 6 / 9}


def test_sampled_answers_compare_by_length_and_finish_reason():
    tally = Tally()
    tally.add(False, (1, 2), "stop", (1, 2, 3, 4), "length", usage(4))
    dist = tally.to_dict()["distribution"]
    assert dist["production"] == {"requests": 1, "mean_length": 2.0, "finish_reasons": {"stop": 1}}
    assert dist["shadow"]["finish_reasons"] == {"length": 1}
    assert tally.to_dict()["deterministic"]["token_equality"] is None     # nothing deterministic yet


def test_shadow_figures_come_from_its_usage():
    tally = Tally()
    tally.add(True, (1,) * 5, "length", (1,) * 5, "length", usage(5, rounds=2, accepted=4))
    shadow = tally.to_dict()["shadow"]
    assert shadow["accept_length"] == 2.0 and shadow["ttft_p50_s"] == 0.01
    assert abs(shadow["itl_p50_s"] - 0.002) < 1e-9 and shadow["tokens_per_s"] > 0


def test_the_shadows_accepted_length_is_its_drafts_from_trials_when_it_ran_plain_rounds():
    """An adaptive shadow that decoded plainly (one token a round) still says what its draft
    would accept on this traffic: the rounds as run are tokens_per_round."""
    tally = Tally()
    plain_rounds = Usage(prompt_tokens=4, completion_tokens=9, rounds=8, accepted=8, ttft_s=0.01,
                         total_s=0.03, trials=4, trial_accepted=6, trial_weight=4)
    tally.add(True, (1,) * 9, "length", (1,) * 9, "length", plain_rounds)
    shadow = tally.to_dict()["shadow"]
    assert shadow["accept_length"] == 2.5 and shadow["tokens_per_round"] == 1.0 and shadow["trials"] == 4


def test_memory_is_bounded_however_many_records_arrive():
    tally = Tally()
    for i in range(5 * WINDOW):
        tally.add(i % 2 == 0, (1, 2), f"reason-{i}", (1, 2), f"reason-{i}", usage(2))
        tally.keep_sample("p", "a", "b", ())
    assert len(tally.ttft) == len(tally.itl) == WINDOW and len(tally.samples) == MAX_SAMPLES
    assert len(tally.production.reasons) == MAX_REASONS + 1               # the cap, then "other"


def test_samples_are_redacted_and_cut():
    assert redact("key sk-abcdefghijklmnopq here") == "key [redacted] here"
    assert redact("Authorization: Bearer abc.def-123") == "Authorization: [redacted]"
    assert redact('{"api_key": "hunter2"}') == '{"[redacted]"}'
    assert redact("the server key s3cret-value", ("s3cret-value",)) == "the server key [redacted]"
    tally = Tally()
    tally.keep_sample("x" * 10_000, "a", "b", ())
    assert len(tally.samples[0]["prompt"]) == 2000


def test_the_tap_only_appends_and_skips_records_it_would_be_slow_to_serialize():
    """Tap.offer on the event loop: no target, nothing; too long, skipped; full, dropped."""
    import asyncio

    from serving.engine import StopRule
    from serving.engine.events import Finished
    from serving.sampling import SamplingParams
    from serving.server.mirror import MAX_RECORD_IDS, TAP_QUEUE, Tap

    async def offer_all() -> dict:
        tap = Tap(True)
        answer = Finished("x", (1, 2), "length", usage(2))
        args = (SamplingParams(temperature=0), StopRule(8))
        tap.offer([1], *args, answer)                       # not started: ignored
        tap.target = ("127.0.0.1", 9)                       # active, no sender: the queue fills
        tap.offer([1] * MAX_RECORD_IDS, *args, answer)
        for _ in range(TAP_QUEUE + 5):
            tap.offer([1, 2, 3], *args, answer)
        return tap.to_dict()
    counts = asyncio.run(offer_all())
    assert counts["offered"] == TAP_QUEUE + 6 and counts["skipped_long"] == 1
    assert counts["queued"] == TAP_QUEUE and counts["dropped_full"] == 5
