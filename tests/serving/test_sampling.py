"""logits -> probs -> token: temperature, top-k, top-p, seeded reproducibility, through the
sequence's positional draws every engine token comes from."""

from __future__ import annotations

import pytest
import torch

from serving.sampling import PositionalDraws, SamplingParams, logits_to_probs

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])


def test_greedy_is_one_hot_at_argmax():
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=0))
    assert probs.tolist() == [[1.0, 0, 0, 0, 0, 0]]
    assert PositionalDraws(0).choose(LOGITS, SamplingParams(temperature=0), [0]).tolist() == [0]
    assert SamplingParams(top_k=1).greedy


def test_temperature_scales_the_softmax():
    probs = logits_to_probs(LOGITS, SamplingParams(temperature=0.5))
    torch.testing.assert_close(probs, (LOGITS / 0.5).softmax(-1))


def test_top_k_keeps_k_tokens():
    probs = logits_to_probs(LOGITS, SamplingParams(top_k=3))
    assert (probs > 0).sum().item() == 3
    torch.testing.assert_close(probs[0, :3], LOGITS[0, :3].softmax(-1))


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    full = LOGITS.softmax(-1)[0]                 # [0.56, 0.21, 0.12, 0.08, 0.03, 0.004]
    probs = logits_to_probs(LOGITS, SamplingParams(top_p=0.7))
    assert (probs[0] > 0).tolist() == [True, True, False, False, False, False]
    torch.testing.assert_close(probs[0, :2], full[:2] / full[:2].sum())
    # a tiny p still keeps the most likely token
    assert (logits_to_probs(LOGITS, SamplingParams(top_p=0.01))[0] > 0).sum() == 1


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    params = SamplingParams(temperature=1.0)
    positions = range(64)
    draws = [PositionalDraws(s).choose(LOGITS.repeat(64, 1), params, positions).tolist() for s in (7, 7, 8)]
    assert draws[0] == draws[1] and draws[0] != draws[2]


def test_samples_follow_the_distribution():
    params = SamplingParams(temperature=1.0, top_k=4)
    probs = logits_to_probs(LOGITS, params)
    draws = PositionalDraws(0).choose(LOGITS.repeat(20000, 1), params, range(20000))
    freq = torch.bincount(draws, minlength=6).float() / 20000
    assert freq[4:].sum() == 0
    torch.testing.assert_close(freq, probs[0], atol=0.015, rtol=0)


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2)])
def test_invalid_params_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("temperature,top_p", [(1e-45, 1.0), (5e-324, 0.5), (1.0, 1e-300), (2.0, 5e-324)])
def test_vanishing_temperature_or_top_p_gives_the_argmax(temperature, top_p):
    params = SamplingParams(temperature=temperature, top_p=top_p)
    probs = logits_to_probs(LOGITS, params)
    assert torch.isfinite(probs).all() and probs.tolist() == [[1.0, 0, 0, 0, 0, 0]]
    assert PositionalDraws(0).choose(LOGITS, params, [0]).tolist() == [0]
