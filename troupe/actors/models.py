"""Models without a network: a tiny Qwen2-style causal LM built from a config, a tokenizer
trained locally, and one loader for those, a hub id or a local path.

The embedded default names its model ``tiny`` (``tiny-vl``, in `vision`, adds a vision tower);
any other string is a hub id or a local directory and goes to ``transformers`` unchanged.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from troupe.platform.errors import ConfigError

# The chat format of Qwen2; the tiny tokenizer has these as special tokens.
IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}" + IM_START + "{{ m['role'] }}\n{{ m['content'] }}" + IM_END + "\n{% endfor %}"
    "{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}"
)
MARKER = "troupe_tokenizer.json"  # written beside a tokenizer troupe built


@dataclasses.dataclass
class TinyLMSpec:
    """Shape of the tiny Qwen2-style model (about 150k parameters at the defaults)."""

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 192
    vocab_size: int = 384
    max_position_embeddings: int = 256

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"model.tiny.hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model.tiny.num_heads={self.num_heads} must be divisible by num_kv_heads={self.num_kv_heads}")


def train_tokenizer(corpus: list[str], vocab_size: int = 384, special_tokens: Sequence[str] = ()) -> Any:
    """A byte-level BPE tokenizer trained on ``corpus``, digits kept one per token, with a chat
    template; ``special_tokens`` (e.g. a VL model's vision tokens) follow the chat ones."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Single-digit tokens keep arithmetic learnable; byte-level makes any text encodable.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END, *special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token=IM_END, pad_token=PAD, unk_token=None,
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_lm(spec: TinyLMSpec, tokenizer: Any, seed: int = 0) -> Any:
    """A randomly initialised Qwen2-style causal LM sized by ``spec``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model


def _quiet_transformers() -> None:
    # Per-shard progress bars from every actor drown the run's own progress.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def save_model(model: Any, tokenizer: Any, path: str | Path) -> None:
    _quiet_transformers()
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / MARKER).write_text(json.dumps({"built_by": "troupe"}) + "\n")


def _looks_local(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or Path(name).expanduser().exists() or name.count("/") > 1


def chat_template_text(value: str | None, key: str = "model.chat_template") -> str | None:
    """The Jinja chat template that ``value`` gives: the text of a ``.jinja`` file (or of any
    existing file), else ``value`` itself; None keeps the model's own template."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if value.endswith(".jinja") or ("\n" not in value and _is_file(path)):
        if not _is_file(path):
            raise ConfigError(f"{key}={value!r}: no such template file; give a Jinja string or the path of a "
                              ".jinja file")
        return path.read_text()
    if "{{" not in value and "{%" not in value:
        raise ConfigError(f"{key}={value!r} is neither a file nor a Jinja template (no '{{{{' or '{{%'); give "
                          "a Jinja string or the path of a .jinja file")
    return value


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a template too long for a file name, or with a NUL
        return False


def load_tokenizer(name_or_path: str, chat_template: str | None = None) -> Any:
    """The tokenizer of a model directory or hub id (troupe's own reload as the fast class);
    ``chat_template`` (Jinja text) replaces the one it ships with."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(name_or_path).expanduser()
    if (path / MARKER).is_file():
        # AutoTokenizer beside a qwen2 config.json would rebuild it as a Qwen2Tokenizer with other ids.
        tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tok = AutoTokenizer.from_pretrained(str(path) if path.exists() else name_or_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def load_causal_lm(name_or_path: str, dtype: str = "float32", device: str = "cpu",
                   chat_template: str | None = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local directory or a hub id, with errors that say what to fix;
    ``chat_template`` (Jinja text) replaces the tokenizer's own (see `load_tokenizer`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    _quiet_transformers()
    path = Path(name_or_path).expanduser()
    if _looks_local(name_or_path) and not path.exists():
        raise ConfigError(
            f"model path {name_or_path!r} does not exist; give a local model directory, a hub id, "
            f"or model.path=tiny for the embedded model"
        )
    if path.exists() and not (path / "config.json").is_file():
        raise ConfigError(f"model path {name_or_path!r} has no config.json; is it a saved causal LM?")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if torch_dtype is None:
        raise ConfigError(f"model.dtype={dtype!r}: expected float32, bfloat16 or float16")
    try:
        tok = load_tokenizer(name_or_path, chat_template)
        where = str(path) if path.exists() else name_or_path
        config = AutoConfig.from_pretrained(where)
        # A vision-language checkpoint (e.g. qwen2_5_vl) is no AutoModelForCausalLM; its class
        # still maps (ids, mask, [video]) to next-token logits, so callers treat both alike.
        auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) else AutoModelForCausalLM
        model = auto.from_pretrained(where, config=config, dtype=torch_dtype)
    except OSError as e:
        raise ConfigError(
            f"cannot load model {name_or_path!r}: {e}. Without a network, point model.path at a local "
            f"directory or use model.path=tiny."
        ) from e
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model.to(device), tok


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def model_config_or_error(path: str, key: str, what: str) -> Any:
    """The transformers config of the model at ``path`` (a local directory or a hub id), read
    without its weights so the driver can check a path before any actor starts; else a
    `ConfigError` naming ``key`` and ``what`` the key should give."""
    from pathlib import Path

    from transformers import AutoConfig

    local = Path(path).expanduser()
    if local.exists() and not (local / "config.json").is_file():
        raise ConfigError(f"{key}={path!r} has no config.json: it is not a saved model; give {what}")
    if not local.exists() and (path.startswith(("/", ".", "~")) or path.count("/") > 1):
        raise ConfigError(f"{key}={path!r} does not exist; give a local directory or a hub id of {what}")
    try:
        return AutoConfig.from_pretrained(str(local) if local.exists() else path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{key}={path!r}: cannot read its config ({e}); without a network, point {key} at a "
                          "local directory") from e
