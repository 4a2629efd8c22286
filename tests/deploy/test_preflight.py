"""Ops-side draft/target check on real config.json and safetensors files written to disk."""

import json
import struct

import pytest

from ddops.draft_pairing import LocalFiles, PreflightError, check_model_dir, check_pair, read_pair
from serving.contract import derived_layer_ids, target_layer_ids


def write_model(path, config, tensors):
    """A checkpoint directory: config.json + a safetensors file holding `tensors` {name: shape}."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)
    return str(path)


TARGET = {"hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 300}


def draft_config(ids=(1, 2), hidden=64, mask=299):
    return {"hidden_size": hidden, "num_hidden_layers": 1, "block_size": 4,
            "dflash_config": {"target_layer_ids": list(ids), "mask_token_id": mask}}


def test_matching_pair_has_no_problems(tmp_path):
    target = write_model(tmp_path / "t", TARGET, {"embed.weight": [300, 64]})
    draft = write_model(tmp_path / "d", draft_config(), {"fc.weight": [64, 128]})
    pair = read_pair(LocalFiles(), target, draft)
    assert pair.fc_in_features == 128
    assert check_pair(pair) == []


def test_width_mismatch_names_both_sides_and_their_numbers(tmp_path):
    target = write_model(tmp_path / "t", {**TARGET, "hidden_size": 48}, {})
    draft = write_model(tmp_path / "d", draft_config(), {"model.fc.weight": [64, 128]})
    width, hidden = check_pair(read_pair(LocalFiles(), target, draft))
    assert width.key == "draft fc.weight" and hidden.key == "draft hidden_size"
    assert "draft expects 128 = 2 layers x 64 but the target provides 2 x 48 = 96" in width.reason
    assert target in width.reason and draft in width.reason


def test_width_falls_back_to_draft_hidden_size_without_weights(tmp_path):
    target = write_model(tmp_path / "t", TARGET, {})
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(draft_config(hidden=32)))
    width, hidden = check_pair(read_pair(LocalFiles(), target, str(tmp_path / "d")))
    assert width.key == hidden.key == "draft hidden_size"
    assert "draft expects 64 = 2 layers x 32 but the target provides 2 x 64 = 128" in width.reason


def test_missing_layer_and_mask_outside_vocab(tmp_path):
    target = write_model(tmp_path / "t", TARGET, {})
    draft = write_model(tmp_path / "d", draft_config(ids=(1, 7), mask=300), {"fc.weight": [64, 128]})
    keys = [p.key for p in check_pair(read_pair(LocalFiles(), target, draft))]
    assert keys == ["draft dflash_config.target_layer_ids", "draft dflash_config.mask_token_id"]


def test_layer_ids_derived_when_config_omits_them():
    # docs/references.md, section "DFlash drafts": L=36, n=5 -> [1, 9, 17, 25, 33]; L=64 -> [1, 16, 31, 46, 61]
    assert target_layer_ids({"num_hidden_layers": 5, "num_target_layers": 36}) == [1, 9, 17, 25, 33]
    assert derived_layer_ids(64, 5) == [1, 16, 31, 46, 61]


def test_missing_or_broken_config_is_one_line_naming_the_file(tmp_path):
    target = write_model(tmp_path / "t", TARGET, {})
    with pytest.raises(PreflightError, match=r"/nowhere/config.json: does not exist"):
        read_pair(LocalFiles(), target, "/nowhere")
    (tmp_path / "t" / "config.json").write_text("{oops")
    with pytest.raises(PreflightError, match=r"t/config.json: not valid JSON"):
        read_pair(LocalFiles(), target, target)
    assert check_model_dir(LocalFiles(), "/nowhere", "target")[0].reason == "/nowhere/config.json does not exist"
