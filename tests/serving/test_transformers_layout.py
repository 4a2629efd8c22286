"""Checkpoints saved by transformers' own `save_pretrained`: the runtime's prompt ids and greedy answers
equal transformers' on the files transformers writes (chat_template.jinja, additional_chat_templates/,
the older tokenizer_config.json key, rope_parameters in config.json)."""

from __future__ import annotations

import json

import pytest
import torch

from serving.engine import Engine, StopRule
from serving.engine.build import runner_factory
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.tools.tiny import train_tokenizer
from tests.serving.conftest import load

import transformers  # noqa: E402  (dev dependency: a missing one must fail, not skip)

# A ChatML template that adds a default system prompt when the chat has none, as SmolLM2's does:
# the 21 prompt tokens a plain ChatML fallback loses.
DEFAULT_SYSTEM = ("{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                  "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
                  "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATS = [
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Name a colour."}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
      {"role": "user", "content": "Tell me a short joke."}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}], False),
]


def runtime_ids(tokenizer: Tokenizer, chat: list[dict], add_generation_prompt: bool) -> list[int]:
    return tokenizer.encode(tokenizer.render_chat(chat, add_generation_prompt), prompt=False)


def hf_ids(hf, chat: list[dict], add_generation_prompt: bool) -> list[int]:
    return list(hf.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=True,
                                       return_dict=False))


def tiny_hf_tokenizer(template) -> transformers.PreTrainedTokenizerFast:
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(), eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token="<|endoftext|>", chat_template=template)


def assert_same_prompts(directory):
    hf = transformers.AutoTokenizer.from_pretrained(directory)
    ours = Tokenizer.from_dir(directory)
    for chat, add_generation_prompt in CHATS:
        assert runtime_ids(ours, chat, add_generation_prompt) == hf_ids(hf, chat, add_generation_prompt)
    return ours


def test_chat_template_jinja_file_is_read(tmp_path):
    tiny_hf_tokenizer(DEFAULT_SYSTEM).save_pretrained(tmp_path)
    assert (tmp_path / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    ours = assert_same_prompts(tmp_path)
    assert "You are a helpful assistant." in ours.render_chat(CHATS[0][0])


def test_legacy_tokenizer_config_key_still_read(tmp_path):
    tiny_hf_tokenizer(DEFAULT_SYSTEM).save_pretrained(tmp_path, save_jinja_files=False)
    assert not (tmp_path / "chat_template.jinja").exists()
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == DEFAULT_SYSTEM
    assert_same_prompts(tmp_path)


def test_jinja_file_wins_over_the_config_key(tmp_path):
    """transformers' precedence (PreTrainedTokenizerBase._from_pretrained): template files replace the key."""
    tiny_hf_tokenizer(DEFAULT_SYSTEM).save_pretrained(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    stale = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    config.write_text(json.dumps({**json.loads(config.read_text()), "chat_template": stale}))
    ours = assert_same_prompts(tmp_path)
    assert ours.chat_template == DEFAULT_SYSTEM


def test_named_templates_in_additional_folder(tmp_path):
    tool_use = "{{ 'tools' }}"
    tiny_hf_tokenizer({"default": DEFAULT_SYSTEM, "tool_use": tool_use}).save_pretrained(tmp_path)
    assert (tmp_path / "additional_chat_templates" / "tool_use.jinja").read_text() == tool_use
    ours = assert_same_prompts(tmp_path)
    assert ours.chat_template == DEFAULT_SYSTEM


def test_processor_chat_template_json_is_the_last_resort(tmp_path):
    tiny_hf_tokenizer(None).save_pretrained(tmp_path)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": DEFAULT_SYSTEM}))
    assert Tokenizer.from_dir(tmp_path).chat_template == DEFAULT_SYSTEM
    (tmp_path / "chat_template.jinja").write_text("{{ 'jinja' }}")
    assert Tokenizer.from_dir(tmp_path).chat_template == "{{ 'jinja' }}"


@pytest.fixture(scope="module")
def tiny_saved(tmp_path_factory):
    """A random tiny LlamaForCausalLM and its tokenizer, both saved by transformers."""
    out = tmp_path_factory.mktemp("hf-tiny")
    hf = tiny_hf_tokenizer(DEFAULT_SYSTEM)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(hf), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rope_theta=50000.0,
        eos_token_id=hf.convert_tokens_to_ids("<|im_end|>"), tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(out)
    hf.save_pretrained(out)
    return out, model, hf


def greedy_pairs(directory, reference, hf, max_new_tokens: int):
    """(runtime ids, transformers generate ids) for every chat asking for an answer."""
    ours, tokenizer = load(directory), Tokenizer.from_dir(directory)
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    engine = Engine(runner_factory(ours, 512), tokenizer).start()
    pairs = []
    try:
        for chat, _ in CHATS[:3]:
            ids = tokenizer.encode_chat(chat)
            result = engine.generate(ids, SamplingParams(temperature=0), StopRule(max_new_tokens,
                                                                                  stop_ids=frozenset({eos})))
            with torch.no_grad():
                expected = reference.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                              eos_token_id=eos, pad_token_id=eos)[0, len(ids):].tolist()
            pairs.append((list(result.token_ids), expected))
    finally:
        engine.stop()
    return pairs


def test_tiny_transformers_checkpoint_prompts_and_greedy(tiny_saved):
    out, model, hf = tiny_saved
    assert "rope_parameters" in json.loads((out / "config.json").read_text())
    assert_same_prompts(out)
    for ours, expected in greedy_pairs(out, model, hf, max_new_tokens=12):
        assert ours == expected


@pytest.fixture(scope="module")
def smollm_saved(smollm_dir, tmp_path_factory):
    """SmolLM2-135M-Instruct re-saved by transformers: model and tokenizer as transformers writes them."""
    out = tmp_path_factory.mktemp("hf-smollm2")
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm_dir, dtype=torch.float32).eval()
    model.save_pretrained(out)
    hf = transformers.AutoTokenizer.from_pretrained(smollm_dir)
    hf.save_pretrained(out)
    return out, model, hf


@pytest.mark.smollm
def test_smollm2_saved_by_transformers_prompts(smollm_saved):
    out, _, _ = smollm_saved
    assert (out / "chat_template.jinja").is_file()
    ours = assert_same_prompts(out)
    chatml = Tokenizer(ours.backend, {}, "no template")      # what the runtime rendered before reading the file
    assert len(ours.encode_chat(CHATS[0][0])) - len(chatml.encode_chat(CHATS[0][0])) == 21  # SmolLM2's system prompt


@pytest.mark.smollm
def test_smollm2_saved_by_transformers_greedy(smollm_saved):
    out, model, hf = smollm_saved
    pairs = greedy_pairs(out, model, hf, max_new_tokens=24)
    for ours, expected in pairs:
        assert ours == expected
    assert "Paris" in hf.decode(pairs[0][0])
