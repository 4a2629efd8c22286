"""TextAssembler: stop ids, EOS, stop strings across tokens, max_tokens, held-back text."""

from __future__ import annotations

from serving.engine import StopRule, TextAssembler

PIECES = {1: "Hello", 2: ",", 3: " wor", 4: "ld", 5: "!", 6: " END", 7: "\n", 9: "<eos>"}


def decode(ids):
    return "".join(PIECES[i] for i in ids)


def run(rule, rounds):
    text = TextAssembler(rule, decode)
    deltas = [text.feed(r) for r in rounds]
    return text, deltas


def test_max_tokens_truncates_a_round():
    text, deltas = run(StopRule(max_new_tokens=3), [[1, 2], [3, 4, 5]])
    assert text.finish_reason == "length" and text.ids == [1, 2, 3]
    assert "".join(deltas) == text.text == "Hello, wor"


def test_stop_id_ends_without_showing_it():
    text, deltas = run(StopRule(10, stop_ids=frozenset({9})), [[1, 9, 3]])
    assert text.finish_reason == "stop" and text.text == "Hello" and text.ids == [1, 9]


def test_stop_string_spanning_tokens_is_cut_and_never_shown():
    text, deltas = run(StopRule(10, stop_strings=("world!",)), [[1, 2], [3], [4], [5, 6]])
    assert text.finish_reason == "stop"
    assert text.text == "Hello, "
    assert deltas == ["Hello,", " ", "", ""]    # "wor" might start the stop string: held back


def test_held_back_text_is_released_when_it_is_not_a_stop():
    text, deltas = run(StopRule(10, stop_strings=(" wore",)), [[1], [3], [4], [7]])
    assert deltas == ["Hello", "", " world", "\n"]
    assert text.finish_reason is None


def test_earliest_stop_string_wins():
    text, _ = run(StopRule(10, stop_strings=("!", "ld")), [[1, 3, 4, 5]])
    assert text.text == "Hello wor"


def test_incomplete_utf8_is_held_until_complete():
    pieces = {1: "caf", 2: "\ufffd", 3: "é"}
    state = {"ids": None}

    def utf8_decode(ids):          # the tokenizer shows U+FFFD while a character is half there
        state["ids"] = ids
        text = "".join(pieces[i] for i in ids)
        return text.replace("\ufffd", "") + ("\ufffd" if ids[-1] == 2 else "")

    text = TextAssembler(StopRule(10), utf8_decode)
    assert text.feed([1]) == "caf"
    assert text.feed([2]) == ""
    assert text.feed([3]) == "é"


def test_a_round_running_past_a_stop_string_keeps_only_the_ids_up_to_it():
    # a speculative round can commit several tokens; the ones after the stop are dropped
    text, _ = run(StopRule(10, stop_strings=("world",)), [[1, 3, 4, 5, 6]])
    assert text.ids == [1, 3, 4] and text.text == "Hello " and text.finish_reason == "stop"


def test_a_round_running_past_a_stop_id_or_max_tokens():
    assert run(StopRule(10, stop_ids=frozenset({9})), [[1, 2, 9, 3, 4]])[0].ids == [1, 2, 9]
    assert run(StopRule(2), [[1, 2, 3, 4]])[0].ids == [1, 2]
