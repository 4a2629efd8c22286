"""TextAssembler: stop ids, EOS, stop strings across tokens, max_tokens, held-back text."""

from __future__ import annotations

import json

import pytest

from serving.engine import StopRule, TextAssembler
from serving.models.tokenizer import Tokenizer

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


# Real decoders: the incremental text equals a whole decode, and no decode grows with the answer.
MIXED = ("def área(r):\n    return 3.14159 * r ** 2  # π r²\n"
         "Grüße aus München! 日本語のテキスト、絵文字 🎉🚀 and ünïcödé.\n"
         "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;\n") * 20


def _assemble(tokenizer, ids, rounds_of):
    calls = []

    def decode(window):
        calls.append(len(window))
        return tokenizer.decode(window)

    text = TextAssembler(StopRule(len(ids) + 1), decode)
    deltas, i = [], 0
    while i < len(ids):
        step = rounds_of(i)
        deltas.append(text.feed(ids[i:i + step]))
        i += step
    return text, "".join(deltas), max(calls)


def _sentencepiece_style():
    """A BPE tokenizer with SentencePiece's decoders (▁ for spaces, byte fallback, the first
    token's space stripped), trained here on MIXED."""
    from tokenizers import Tokenizer as Backend, decoders, models, normalizers, pre_tokenizers, trainers

    def backend_with(model):
        backend = Backend(model)
        backend.normalizer = normalizers.Replace(" ", "▁")
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(" ", 1, 0)])
        return backend

    trained = backend_with(models.BPE(unk_token="<unk>"))
    trained.train_from_iterator([MIXED[:300]], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"],
                                                                    limit_alphabet=40))
    learned = json.loads(trained.to_str())["model"]
    vocab = dict(learned["vocab"])
    for b in range(256):                  # what no piece covers falls back to its UTF-8 bytes
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    backend = backend_with(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    backend.add_special_tokens(["<unk>"])
    return backend


@pytest.mark.parametrize("kind", ["smollm2", "sentencepiece"])
def test_incremental_text_equals_a_whole_decode_in_short_windows(kind, smollm_dir):
    if kind == "smollm2":
        tokenizer = Tokenizer.from_dir(smollm_dir)
        ids, special = tokenizer.encode(MIXED, prompt=False), tokenizer.token_id("<|im_start|>")
        backend, space = tokenizer.backend, "Ġ"
    else:
        tokenizer = backend = _sentencepiece_style()
        ids, special = tokenizer.encode(MIXED).ids, tokenizer.token_to_id("<unk>")
        space = "▁"
    spaced = [backend.id_to_token(t).startswith(space) for t in ids]     # a word's first token
    with_specials = [t for i, t in enumerate(ids) for t in ([special, t] if spaced[i] and i % 3 == 0 else [t])]
    for ids in (ids, with_specials):          # a special token decodes to nothing mid-answer
        whole = tokenizer.decode(ids)
        assert "\ufffd" not in whole and len(ids) > 1000
        for rounds_of in (lambda i: 1, lambda i: 1 + i % 5):      # plain decoding; speculative rounds
            text, shown, longest = _assemble(tokenizer, ids, rounds_of)
            assert text.text == shown == whole
            assert longest <= 16         # a window of the last few ids (a character's bytes, silent tokens), not 1000+
