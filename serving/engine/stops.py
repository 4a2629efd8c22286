"""Turning committed tokens into text: stop ids, EOS, stop strings and max_tokens.

Pure: feed token ids in, get the text that is safe to show and whether the sequence ended.
Text that could still become a stop string, or an incomplete UTF-8 character, is held back
until the next tokens decide it.

Decoding is incremental: each token decodes a window of the last few ids, never the whole
answer, so a token costs the same at position 4000 as at 4. The window starts at the last
settled ids that show text (`anchor`), so a decoder that treats a sequence's first token apart
(SentencePiece strips its leading space) strips it from the window's head and its text alike,
and the new text is what follows the head. Ids settle once their text ends on a whole character.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StopRule:
    max_new_tokens: int
    stop_strings: tuple[str, ...] = ()
    stop_ids: frozenset[int] = frozenset()   # EOS ids included unless the request ignores EOS


@dataclass
class TextAssembler:
    rule: StopRule
    decode: callable                          # list[int] -> str
    ids: list[int] = field(default_factory=list)   # counted completion tokens
    shown: int = 0                            # chars of the text already handed out
    finish_reason: str | None = None
    text: str = ""
    settled: int = 0                          # ids[:settled] end on a whole character
    settled_text: str = ""                    # their text, for good
    anchor: int = 0                           # the window's first id: settled ids that show text
    head: int = 0                             # len(decode(ids[anchor:settled]))

    def feed(self, tokens: list[int]) -> str:
        """Consume one round's tokens; return newly showable text (may be empty).

        Token by token, so a round that runs past a stop (id, string or max_tokens) keeps
        exactly the ids plain decoding would have produced.
        """
        for token in tokens:
            if self.finish_reason:
                break
            self.ids.append(token)
            if token in self.rule.stop_ids:           # never shown; text stays as it was
                self.finish_reason = "stop"
                break
            self.text = self._decoded()
            cut = self._stop_string_at()
            if cut is not None:
                self.text, self.finish_reason = self.text[:cut], "stop"
            elif len(self.ids) >= self.rule.max_new_tokens:
                self.finish_reason = "length"
        end = len(self.text) if self.finish_reason else self._safe_end()
        delta, self.shown = self.text[self.shown:end], max(self.shown, end)
        return delta

    def _decoded(self) -> str:
        """The text of every id so far, decoding only ids[anchor:]; settles them when whole."""
        window = self.decode(self.ids[self.anchor:])
        text = self.settled_text + window[self.head:]
        if not window.endswith("\ufffd"):                  # a whole character: settle
            settling = self.decode(self.ids[self.settled:])
            if settling:            # the window moves up; a special token, shown as nothing, is no anchor
                self.anchor, self.head = self.settled, len(settling)
            else:
                self.head = len(window)
            self.settled, self.settled_text = len(self.ids), text
        return text

    def _stop_string_at(self) -> int | None:
        hits = [self.text.find(s, max(0, self.shown - len(s))) for s in self.rule.stop_strings]
        hits = [h for h in hits if h >= 0]
        return min(hits) if hits else None

    def _safe_end(self) -> int:
        end = len(self.text)
        while end > self.shown and self.text[end - 1] == "\ufffd":   # partial UTF-8 sequence
            end -= 1
        for s in self.rule.stop_strings:                               # a stop string may be starting
            for k in range(min(len(s) - 1, end - self.shown), 0, -1):
                if self.text[end - k:end] == s[:k]:
                    end -= k
                    break
        return end
