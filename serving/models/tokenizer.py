"""Tokenizer: an HF `tokenizer.json` plus `tokenizer_config.json` (special tokens) and the chat template.

The chat template is read where transformers reads it (`chat_template_settings`) and rendered with a
sandboxed Jinja environment configured as HF renders it (trim_blocks, lstrip_blocks,
`raise_exception`, `tojson`).

Message content cannot forge chat structure: special-token text a user types (`<|im_end|>`) is
encoded as text, as transformers does with `split_special_tokens=True`, while the template's own
special tokens stay control tokens (`encode_chat`). Encoding goes through `encode_batch`, which
releases the interpreter lock (a single `encode` holds it: 0.8 s for 1 MB of text), so the server
can tokenize in a worker thread without stalling its event loop.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cached_property
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from serving.models.config import ModelError

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")
# Sentinels for special-token text hidden from the template: supplementary private-use planes
# 15 and 16, never assigned by Unicode; a content character there is kept as itself.
PRIVATE_USE = re.compile("[\U000F0000-\U0010FFFD]")
PREFIX_CHARS_PER_TOKEN = 8      # prose and code run 3 to 5 characters per token
PREFIX_MARGIN = 64


class PromptTooLong(ValueError):
    """The text needs more tokens than allowed, known before encoding all of it."""


class Tokenizer:
    def __init__(self, backend: HFTokenizer, settings: dict, where: str):
        self.backend = backend
        self.where = where
        self.bos_token = _token_text(settings.get("bos_token"))
        self.eos_token = _token_text(settings.get("eos_token"))
        self.add_bos = bool(settings.get("add_bos_token", False))
        self.chat_template = _template_source(settings.get("chat_template"))
        self._template = None
        specials = {i: t.content for i, t in backend.get_added_tokens_decoder().items() if t.special}
        self.special_ids = frozenset(specials)
        by_length = sorted(set(specials.values()), key=len, reverse=True)   # longest match first
        self._special_text = re.compile("|".join(map(re.escape, by_length))) if by_length else None

    # cached_property: built on first use (a few hundred ms for a large vocabulary); two threads
    # racing to build one build the same value
    @cached_property
    def as_text(self) -> HFTokenizer:
        """The backend reading special-token text as text: a second backend, not a flag toggled
        on the first, because encoding runs in several threads at once."""
        backend = HFTokenizer.from_str(self.backend.to_str())
        backend.encode_special_tokens = True
        return backend

    @cached_property
    def longest_token_chars(self) -> int:
        """The most characters one token covers: a byte-level token string has one character
        per byte, so its length bounds the text characters it encodes (a sentencepiece one's
        equals them)."""
        return max(map(len, self.backend.get_vocab(with_added_tokens=True)), default=1)

    @classmethod
    def from_dir(cls, model_dir) -> "Tokenizer":
        directory = Path(model_dir)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"{path}: missing file (the runtime needs a tokenizers-format tokenizer.json)")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as e:
            raise ModelError(f"{path}: unreadable tokenizer ({e})") from None
        settings_path = directory / "tokenizer_config.json"
        settings = json.loads(settings_path.read_text()) if settings_path.is_file() else {}
        return cls(backend, chat_template_settings(directory, settings), str(settings_path))

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.backend.token_to_id(text)

    @property
    def eos_ids(self) -> set[int]:
        eos = self.token_id(self.eos_token)
        return set() if eos is None else {eos}

    def check_length(self, text: str, limit: int | None) -> None:
        """PromptTooLong when `text` cannot fit `limit` tokens, decided without encoding it all.

        First its normalized length over the most characters one token covers: a lower bound
        on its token count. Then, for text over PREFIX_CHARS_PER_TOKEN characters per allowed
        token, the tokens of a prefix cut before a space: where the pre-tokenizer splits at
        whitespace (every byte-level BPE one) the whole text has at least the prefix's tokens;
        PREFIX_MARGIN tokens allow for merges across the cut elsewhere. So text far past the
        context costs at most a prefix of PREFIX_CHARS_PER_TOKEN x limit characters to refuse."""
        if limit is None or len(text) <= limit:
            return
        normalizer = self.backend.normalizer
        chars = len(normalizer.normalize_str(text)) if normalizer is not None else len(text)
        if chars > limit * self.longest_token_chars:
            raise PromptTooLong(f"the prompt is {chars} characters; at most {self.longest_token_chars} "
                                f"characters per token, it needs more than {limit} tokens")
        cut = text.rfind(" ", 0, limit * PREFIX_CHARS_PER_TOKEN)
        if len(text) > limit * PREFIX_CHARS_PER_TOKEN and cut > 0:
            tokens = len(_ids(self.backend, text[:cut], False))
            if tokens - PREFIX_MARGIN >= limit:
                raise PromptTooLong(f"the prompt's first {cut} characters alone are {tokens} tokens, "
                                    f"more than {limit}")

    def encode(self, text: str, prompt: bool = True, limit: int | None = None) -> list[int]:
        """Token ids of `text`; a plain prompt gets the BOS the checkpoint asks for. `limit`:
        refuse text that cannot fit that many tokens before encoding it (check_length)."""
        self.check_length(text, limit)
        ids = _ids(self.backend, text, prompt)
        bos = self.token_id(self.bos_token)
        if prompt and self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            self._template = _environment().from_string(self.chat_template or CHATML)
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError as e:
            raise ValueError(f"chat template: {e}") from None

    def encode_chat(self, messages: list[dict], limit: int | None = None) -> list[int]:
        """Token ids of the rendered chat; the rendered template already carries every special
        token it wants, and special-token text inside a message's content is encoded as text.
        `limit`: as for `encode`, checked on the rendered text."""
        hidden: dict[str, str] = {}          # sentinel character -> the special-token text it hides
        texts = [m["content"] for m in messages if isinstance(m.get("content"), str)]
        taken = {c for text in texts for c in PRIVATE_USE.findall(text)}    # kept as themselves
        safe = [{**m, "content": self._hide(m["content"], hidden, taken)} if isinstance(m.get("content"), str)
                else m for m in messages]
        rendered = self.render_chat(safe)
        self.check_length(rendered, limit)
        if not hidden:
            return self.encode(rendered, prompt=False)
        return self._encode_hiding(rendered, hidden)

    def _hide(self, content: str, hidden: dict[str, str], taken: set[str]) -> str:
        """`content` with each special-token text replaced by a sentinel character not in any
        message (recorded in `hidden` and `taken`)."""
        if self._special_text is None or not self._special_text.search(content):
            return content
        sentinel = {text: key for key, text in hidden.items()}

        def swap(match) -> str:
            text = match.group()
            if text not in sentinel:
                key = next(chr(c) for c in range(0xF0000, 0x10FFFE) if chr(c) not in taken)
                taken.add(key)
                sentinel[text], hidden[key] = key, text
            return sentinel[text]
        return self._special_text.sub(swap, content)

    def _encode_hiding(self, rendered: str, hidden: dict[str, str]) -> list[int]:
        """The backend's own split of `rendered` at the template's special tokens (their ids and
        offsets, so any lstrip/rstrip they declare holds), each text piece between them encoded with
        the hidden special-token text put back and read as text."""
        whole = _encoding(self.backend, rendered, False)
        ids, begin = [], 0
        restore = re.compile("|".join(map(re.escape, hidden)))
        for token, (start, end) in zip(whole.ids, whole.offsets):
            if token in self.special_ids:
                ids += self._as_text(restore.sub(lambda m: hidden[m.group()], rendered[begin:start]))
                ids.append(token)
                begin = end
        return ids + self._as_text(restore.sub(lambda m: hidden[m.group()], rendered[begin:]))

    def _as_text(self, text: str) -> list[int]:
        return _ids(self.as_text, text, False) if text else []


def _encoding(backend: HFTokenizer, text: str, add_special_tokens: bool):
    # encode_batch releases the interpreter lock while it works; encode does not
    return backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]


def _ids(backend: HFTokenizer, text: str, add_special_tokens: bool) -> list[int]:
    return _encoding(backend, text, add_special_tokens).ids


def chat_template_settings(directory: Path, settings: dict) -> dict:
    """`settings` with the chat template transformers would load from `directory`.

    transformers 5 saves templates as files: `chat_template.jinja` (the default) and
    `additional_chat_templates/NAME.jinja`, and drops the `tokenizer_config.json` key. Its
    `PreTrainedTokenizerBase._from_pretrained` lets any such file replace the key entirely; we do the
    same. `chat_template.json` is the processors' legacy file (`ProcessorMixin`), which a tokenizer
    never reads: here it is only the last resort before the runtime's plain ChatML.
    """
    templates = {path.stem: path.read_text(encoding="utf-8")
                 for path in sorted((directory / "additional_chat_templates").glob("*.jinja"))}
    default = directory / "chat_template.jinja"
    if default.is_file():
        templates["default"] = default.read_text(encoding="utf-8")
    if templates:
        return {**settings, "chat_template": templates}
    legacy = directory / "chat_template.json"
    if settings.get("chat_template") is None and legacy.is_file():
        return {**settings, "chat_template": json.loads(legacy.read_text()).get("chat_template")}
    return settings


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _raise(message: str):
    raise TemplateError(message)


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # {"content": "<|im_end|>", "lstrip": ...}
        return value.get("content")
    return value


def _template_source(value) -> str | None:
    if isinstance(value, list):  # tokenizer_config.json: [{"name": "default", "template": "..."}, ...]
        value = {t.get("name"): t.get("template") for t in value}
    if isinstance(value, dict):  # {name: template}, as chat_template_settings reads the files
        return value.get("default") or next(iter(value.values()), None)
    return value
