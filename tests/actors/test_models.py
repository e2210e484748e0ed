import pytest
import torch

from troupe.actors.models import (
    IM_END,
    TinyLMSpec,
    build_tiny_lm,
    count_parameters,
    load_causal_lm,
    load_tokenizer,
    train_tokenizer,
)
from troupe.platform.errors import ConfigError


def test_tokenizer_keeps_digits_apart_and_round_trips():
    tok = train_tokenizer(["12+34=46", "99+1=100", "hello world"] * 50)
    ids = tok("123+45=", add_special_tokens=False)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert pieces[:3] == ["1", "2", "3"]
    assert tok.decode(ids) == "123+45="
    assert tok.eos_token == IM_END and tok.pad_token_id != tok.eos_token_id


def test_chat_template_renders_generation_prompt():
    tok = train_tokenizer(["1+1=2"] * 10)
    text = tok.apply_chat_template([{"role": "user", "content": "1+1="}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_model_has_about_150k_parameters(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir)
    assert 80_000 < count_parameters(model) < 250_000


def test_saved_model_reloads_identically_from_a_local_path(tiny_model_dir):
    a, tok = load_causal_lm(tiny_model_dir)
    b, tok2 = load_causal_lm(tiny_model_dir)
    from transformers import PreTrainedTokenizerFast

    assert isinstance(tok2, PreTrainedTokenizerFast) and "Qwen2" not in type(tok2).__name__
    x = torch.tensor([tok("12+3=", add_special_tokens=False)["input_ids"]])
    assert torch.equal(a(x).logits, b(x).logits)
    assert load_tokenizer(tiny_model_dir)("7", add_special_tokens=False)["input_ids"] == tok("7", add_special_tokens=False)["input_ids"]


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_causal_lm(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        load_causal_lm(str(tmp_path / "empty"))


def test_unreachable_hub_id_is_a_clear_error(monkeypatch):
    import huggingface_hub.constants

    # The hub reads HF_HUB_OFFLINE at import; patch the constant too so no connection is tried.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ConfigError, match="cannot load model"):
        load_causal_lm("some-org/some-model-that-is-not-cached")


def test_spec_validation():
    with pytest.raises(ConfigError, match="divisible"):
        TinyLMSpec(hidden_size=30, num_heads=4)


def test_build_is_seeded():
    tok = train_tokenizer(["1+1=2"] * 10)
    a, b = build_tiny_lm(TinyLMSpec(), tok, seed=3), build_tiny_lm(TinyLMSpec(), tok, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
