"""The shipped prompt set and user prompt files."""

import pytest

from ddops.rollout.shadow.prompts import PromptFileError, load_prompts


def test_shipped_set_has_code_and_prose_with_unique_ids():
    prompts = load_prompts()
    ids = [p.id for p in prompts]
    assert len(ids) == len(set(ids)) >= 10
    assert any(i.startswith("code-") for i in ids) and any(i.startswith("prose-") for i in ids)


def test_user_file_accepts_strings_mappings_and_json_lines(tmp_path):
    (tmp_path / "p.yaml").write_text("- Hello there\n- {id: two, prompt: Second}\n")
    assert [(p.id, p.text) for p in load_prompts(tmp_path / "p.yaml")] == \
        [("p0", "Hello there"), ("two", "Second")]
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "x"}\n\n{"prompt": "y"}\n')
    assert [p.id for p in load_prompts(tmp_path / "p.jsonl")] == ["a", "p1"]


@pytest.mark.parametrize("body, message", [
    ("{}", "expected a non-empty list"),
    ("- {prompt: ''}", "entry 0: 'prompt' must be a non-empty string"),
    ("- {id: a, prompt: x}\n- {id: a, prompt: y}", "id 'a': duplicate id"),
    ("- {prompt: x, temperature: 1}", "entry 0: unknown key 'temperature'"),
    ("- [unclosed", "bad YAML"),
])
def test_bad_prompt_files_name_file_entry_and_reason(tmp_path, body, message):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(PromptFileError, match=f"^{path}: .*{message}"):
        load_prompts(path)


def test_missing_prompt_file_is_named(tmp_path):
    with pytest.raises(PromptFileError, match="nope.yaml: cannot read"):
        load_prompts(tmp_path / "nope.yaml")
