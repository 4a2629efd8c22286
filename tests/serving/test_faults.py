"""Injected faults (DDOPS_SERVING_FAULTS): which requests fail, and bad settings refused."""

import pytest

from serving.server.faults import Faults, from_environment


def test_after_n_requests_a_share_fails_evenly():
    faults = from_environment({"DDOPS_SERVING_FAULTS": "after=2, error_ratio=0.5"})
    pattern = [faults.next_fails() for _ in range(10)]
    assert pattern == [False, False, False, True, False, True, False, True, False, True]
    third = Faults(after=0, error_ratio=1 / 3)
    assert sum(third.next_fails() for _ in range(30)) == 10


def test_unset_means_no_faults():
    faults = from_environment({})
    assert not any(faults.next_fails() for _ in range(100))


@pytest.mark.parametrize("text, message", [("after=x", "after: not a number"),
                                           ("delay=1", "unknown key 'delay'"),
                                           ("error_ratio=1.5", "error_ratio in 0..1")])
def test_malformed_settings_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        from_environment({"DDOPS_SERVING_FAULTS": text})
