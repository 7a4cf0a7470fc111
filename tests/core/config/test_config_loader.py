"""load_config_source: dict / JSON / HJSON / base64 inputs and the errors for bad ones."""
import base64
import json
from pathlib import Path

import pytest

from deepspeed.config import DeepSpeedConfigError, load_config_source

DOC_EXAMPLES = Path(__file__).parent / "doc_examples"

CONFIG = {
    "train_batch_size": 8,
    "gradient_clipping": 1.0,
    "fp16": {"enabled": True, "loss_scale": 0},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999]}},
}


def _write(tmp_path, text, name="ds_config.json"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_dict_is_deep_copied():
    loaded = load_config_source(CONFIG)
    assert loaded == CONFIG
    loaded["optimizer"]["params"]["betas"].append(1.0)
    loaded["fp16"]["enabled"] = False
    assert CONFIG["optimizer"]["params"]["betas"] == [0.9, 0.999]
    assert CONFIG["fp16"]["enabled"] is True


def test_json_file_str_and_pathlike(tmp_path):
    path = _write(tmp_path, json.dumps(CONFIG))
    assert load_config_source(str(path)) == CONFIG
    assert load_config_source(path) == CONFIG


def test_valid_json_keeps_float_type(tmp_path):
    # HJSON would read 1.0 as the int 1; strict JSON documents must come back exactly as JSON.
    loaded = load_config_source(_write(tmp_path, '{"gradient_clipping": 1.0, "x": 1e9}'))
    assert isinstance(loaded["gradient_clipping"], float)
    assert loaded["x"] == 1e9


@pytest.mark.parametrize("name", sorted(p.name for p in DOC_EXAMPLES.glob("*.json")))
def test_doc_examples_load_verbatim(name):
    loaded = load_config_source(DOC_EXAMPLES / name)
    assert isinstance(loaded, dict) and loaded


def test_trailing_comma_doc_examples_content():
    fp32 = load_config_source(DOC_EXAMPLES / "hf_fp32_trailing_comma.json")
    assert fp32 == {"fp16": {"enabled": False}}
    nvme = load_config_source(DOC_EXAMPLES / "hf_nvme_trailing_comma.json")
    assert nvme["zero_optimization"]["aio"]["block_size"] == 262144
    assert nvme["zero_optimization"]["stage3_max_live_parameters"] == 1e9


@pytest.mark.parametrize("encoder", [base64.b64encode, base64.urlsafe_b64encode])
def test_base64_string(encoder):
    # '?' and '>' in the payload make standard and URL-safe alphabets differ.
    config = dict(CONFIG, note="a?b>c~~~")
    encoded = encoder(json.dumps(config).encode()).decode()
    assert load_config_source(encoded) == config


def test_base64_without_padding():
    encoded = base64.urlsafe_b64encode(b'{"train_batch_size": 4}').decode().rstrip("=")
    assert load_config_source(encoded) == {"train_batch_size": 4}


def test_malformed_json_names_file_line_and_column(tmp_path):
    path = _write(tmp_path, '{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true]\n}')
    with pytest.raises(DeepSpeedConfigError) as info:
        load_config_source(path)
    message = str(info.value)
    assert str(path) in message
    assert "line 3 column 27" in message


def test_blocks_separated_by_newlines_only_load(tmp_path):
    # The Monitor tutorial prints its blocks with no commas between them; HJSON reads a newline
    # as a separator, so the pasted block still loads.
    text = '{\n"tensorboard": {"enabled": true}\n"wandb": {"enabled": false}\n}'
    assert load_config_source(_write(tmp_path, text)) == {
        "tensorboard": {"enabled": True}, "wandb": {"enabled": False}}


def test_malformed_after_trailing_comma_reports_the_real_error(tmp_path):
    # The trailing comma (line 2) is fine under HJSON; the unclosed list on line 3 is not.
    path = _write(tmp_path, '{\n  "a": {"b": 1,},\n  "c": [1, 2\n}')
    with pytest.raises(DeepSpeedConfigError, match=r"line 4 column 1"):
        load_config_source(path)


def test_missing_path_is_named():
    with pytest.raises(DeepSpeedConfigError, match=r"'/no/such/ds_config\.json' does not exist"):
        load_config_source("/no/such/ds_config.json")


def test_non_base64_word_reports_missing_path():
    # "config" is valid base64 alphabet but decodes to garbage, so it is a missing path.
    with pytest.raises(DeepSpeedConfigError, match=r"'config' does not exist"):
        load_config_source("config")


@pytest.mark.parametrize("text", ['{"a": 1, "a": 2}', '{"fp16": {"enabled": true, "enabled": false}}',
                                  '{"a": 1, "a": 2,}'])
def test_duplicate_key_rejected_with_key_and_file(tmp_path, text):
    path = _write(tmp_path, text)
    with pytest.raises(DeepSpeedConfigError) as info:
        load_config_source(path)
    assert "duplicate key" in str(info.value)
    assert str(path) in str(info.value)
    assert "'a'" in str(info.value) or "'enabled'" in str(info.value)


def test_duplicate_key_in_base64_rejected():
    encoded = base64.b64encode(b'{"train_batch_size": 1, "train_batch_size": 2}').decode()
    with pytest.raises(DeepSpeedConfigError, match="duplicate key 'train_batch_size'"):
        load_config_source(encoded)


def test_top_level_must_be_object(tmp_path):
    with pytest.raises(DeepSpeedConfigError, match="top level must be a JSON object"):
        load_config_source(_write(tmp_path, "[1, 2]"))


def test_empty_file_and_directory(tmp_path):
    with pytest.raises(DeepSpeedConfigError, match="empty"):
        load_config_source(_write(tmp_path, "  \n"))
    with pytest.raises(DeepSpeedConfigError, match="is a directory"):
        load_config_source(tmp_path)


def test_unsupported_type_and_non_string_keys():
    with pytest.raises(DeepSpeedConfigError, match="got int"):
        load_config_source(3)
    with pytest.raises(DeepSpeedConfigError, match=r"fp16\.1: config keys must be strings"):
        load_config_source({"fp16": {1: True}})
