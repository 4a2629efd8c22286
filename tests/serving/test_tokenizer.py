"""Tokenizer: chat templates rendered as HF renders them, special tokens, BOS handling."""

from __future__ import annotations

import pytest

from serving.models.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def with_settings(tokenizer: Tokenizer, **settings) -> Tokenizer:
    base = {"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}
    return Tokenizer(tokenizer.backend, {**base, **settings}, "tokenizer_config.json")


def test_chatml_template_and_special_tokens(llama_tokenizer):
    text = llama_tokenizer.render_chat(MESSAGES)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = llama_tokenizer.encode_chat(MESSAGES)
    assert ids[0] == llama_tokenizer.token_id("<|im_start|>") and ids.count(llama_tokenizer.token_id("<|im_end|>")) == 2
    assert llama_tokenizer.decode(ids) == "system\nBe brief.\nuser\nHi\nassistant\n"
    assert llama_tokenizer.eos_ids == {llama_tokenizer.token_id("<|im_end|>")}


def test_template_helpers_trim_blocks_and_named_templates(llama_tokenizer):
    template = ("{% for m in messages %}\n    {% if m %}{{ m['role'] }}={{ m | tojson }};{% endif %}\n{% endfor %}"
                "{% if not add_generation_prompt %}{{ raise_exception('needs a prompt') }}{% endif %}{{ eos_token }}")
    tok = with_settings(llama_tokenizer, chat_template=[{"name": "tool_use", "template": "x"},
                                                        {"name": "default", "template": template}])
    rendered = tok.render_chat(MESSAGES[1:])
    assert rendered == 'user={"role": "user", "content": "Hi"};<|im_end|>'
    with pytest.raises(ValueError, match="needs a prompt"):
        tok.render_chat(MESSAGES, add_generation_prompt=False)


def test_add_bos_token_prepends_once(llama_tokenizer):
    tok = with_settings(llama_tokenizer, add_bos_token=True)
    bos = tok.token_id("<|im_start|>")
    assert tok.encode("Hello")[0] == bos and tok.encode("Hello")[1] != bos
    assert tok.encode("<|im_start|>Hello").count(bos) == 1
    assert llama_tokenizer.encode("Hello")[0] != bos
