"""Agreement when only one side returns token ids (vLLM beside the bundled runtime): that
side's ids laid on the common text, the first divergence as a token position; the stream
reader records which text each streamed id settled."""

from ddops.rollout.shadow.compare import _Stream, settled_ends
from ddops.rollout.shadow.stats import Sample, agree, token_equality


def with_ids(text: str, pieces: list[tuple[str, list[int]]], tokens: int | None = None) -> Sample:
    """A vLLM-like streamed sample: each chunk's content and its new token ids."""
    stream = _Stream()
    for content, ids in pieces:
        stream._take({"delta": {"content": content}, "token_ids": ids}, 0.01)
    sample = stream.sample("p", 1.0)
    assert sample.text == text
    return sample


def text_only(text: str, tokens: int) -> Sample:
    return Sample("p", text, None, tokens, 1.0, 0.01)


HELLO = [("Hello", [1]), (",", [2]), (" world", [3]), ("", [0])]  # 0: EOS, no text


def test_settled_ends_give_empty_chunks_the_text_that_follows():
    assert settled_ends([(0, 5), (5, 5), (5, 8), (8, 8)], 8) == (5, 8, 8, 9)
    assert with_ids("Hello, world", HELLO).token_ends == (5, 6, 12, 13)


def test_equal_text_is_equal_in_the_side_with_ids():
    a = agree(text_only("Hello, world", 4), with_ids("Hello, world", HELLO))
    assert (a.equal, a.matched, a.compared, a.unit, a.ids, a.first_divergence) == \
        (True, 4, 4, "token", "shadow", None)


def test_divergence_inside_a_token_counts_that_token_as_differing():
    a = agree(with_ids("Hello, world", HELLO), text_only("Hello, wonder", 5))
    assert (a.equal, a.matched, a.compared, a.ids, a.first_divergence) == \
        (False, 2, 5, "production", 2)  # "Hello" "," match; " world" does not; 5 = the longer


def test_a_side_that_stops_early_differs_at_its_eos():
    a = agree(with_ids("Hello, world", HELLO), text_only("Hello, world again", 6))
    assert a.first_divergence == 3 and a.matched == 3 and a.compared == 6


def test_both_with_ids_compare_ids_and_neither_compares_characters():
    both = agree(Sample("p", "ab", (1, 2), 2, 1.0, 0.0), Sample("p", "ac", (1, 3), 2, 1.0, 0.0))
    assert (both.unit, both.ids, both.first_divergence) == ("token", "both", 1)
    neither = agree(text_only("abc", 2), text_only("abd", 2))
    assert (neither.unit, neither.ids, neither.matched, neither.first_divergence) == ("char", "none", 2, 2)
    assert token_equality([both, neither]) == (1 + 2) / (2 + 3)


def test_a_failed_side_matches_nothing():
    failed = Sample("p", "", None, 0, 1.0, None, "HTTP 500: boom")
    a = agree(with_ids("Hello, world", HELLO), failed)
    assert not a.equal and a.matched == 0 and a.compared == 4
