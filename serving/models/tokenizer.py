"""Tokenizer: an HF `tokenizer.json` plus `tokenizer_config.json` (special tokens) and the chat template.

The chat template is read where transformers reads it (`chat_template_settings`) and rendered with a
sandboxed Jinja environment configured as HF renders it (trim_blocks, lstrip_blocks,
`raise_exception`, `tojson`).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from serving.models.config import ModelError

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
          " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
          "{% endif %}")


class Tokenizer:
    def __init__(self, backend: HFTokenizer, settings: dict, where: str):
        self.backend = backend
        self.where = where
        self.bos_token = _token_text(settings.get("bos_token"))
        self.eos_token = _token_text(settings.get("eos_token"))
        self.add_bos = bool(settings.get("add_bos_token", False))
        self.chat_template = _template_source(settings.get("chat_template"))
        self._template = None

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

    def encode(self, text: str, prompt: bool = True) -> list[int]:
        """Token ids of `text`; a plain prompt gets the BOS the checkpoint asks for."""
        ids = self.backend.encode(text, add_special_tokens=prompt).ids
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

    def encode_chat(self, messages: list[dict]) -> list[int]:
        # the rendered template already carries every special token it wants
        return self.encode(self.render_chat(messages), prompt=False)


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
