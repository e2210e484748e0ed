"""A learned reward model as the reward role: any Hugging Face reward model scores (prompt, completion) rows.

Two kinds of checkpoint are reward models, by hub id or local path:

* a sequence classifier with one label (``AutoModelForSequenceClassification``, ``num_labels=1``):
  the model's own pooling (the last non-pad token for decoder models) gives the reward;
* a causal LM saved with a value head (``v_head.summary.weight`` and ``.bias`` beside the LM
  weights, as TRL's ``AutoModelForCausalLMWithValueHead`` saves it): the head reads the backbone's
  last hidden state at the last token.

Anything else (a plain causal LM, a classifier of several labels) is refused with a `ConfigError`
naming ``reward.path`` and the fix. The input a model reads is the conversation, with the row's
preference demonstrations (``row["demos"]``, see `troupe.envs.preferences.episodes`) written
before the prompt, so one model can be steered per row by the demonstrations in its context.

`RewardModel.score` has `RuleReward.score`'s interface: the rollout code does not know which runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from troupe.actors.base import configure_threads
from troupe.actors.scorer import as_batch
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError
from troupe.platform.preference_rows import Comparison, demos_from_rows

SEQUENCE_CLASSIFIER = "sequence_classifier"
VALUE_HEAD = "value_head"
VALUE_HEAD_KEYS = ("v_head.summary.weight", "v_head.summary.bias")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FIX = ("give a sequence-classification checkpoint with num_labels=1 (AutoModelForSequenceClassification) or "
       "a causal LM saved with a value head (v_head.summary.weight, as TRL's AutoModelForCausalLMWithValueHead "
       "saves it), or set reward.kind=rule")


def _model_file(path: str, name: str) -> str | None:
    """The local file ``name`` of a model directory or of a hub id already in the cache, else None."""
    local = Path(path).expanduser()
    if local.is_dir():
        return str(local / name) if (local / name).is_file() else None
    from transformers.utils import cached_file

    try:
        return cached_file(path, name, _raise_exceptions_for_missing_entries=False)
    except OSError:
        return None


def _weight_names(path: str) -> set[str] | None:
    """The tensor names of a checkpoint's weights, read from file headers (no tensor is loaded);
    None when no weight file is at hand (a hub id not downloaded yet)."""
    index = _model_file(path, "model.safetensors.index.json")
    if index is not None:
        return set(json.loads(Path(index).read_text())["weight_map"])
    single = _model_file(path, "model.safetensors")
    if single is not None:
        from safetensors import safe_open

        with safe_open(single, framework="pt") as f:
            return set(f.keys())
    legacy = _model_file(path, "pytorch_model.bin")
    if legacy is not None:
        return set(torch.load(legacy, map_location="cpu", mmap=True, weights_only=True))
    return None


def reward_model_kind(path: str, key: str = "reward.path") -> str:
    """`SEQUENCE_CLASSIFIER` or `VALUE_HEAD` for the checkpoint at ``path``, or a `ConfigError`
    naming ``key`` and the fix. Reads the config and the weight names only, so the driver can
    check a path before any actor starts; a hub id whose weights are not downloaded yet is
    judged by its config, and its head is checked again when the actor loads it."""
    from troupe.actors.models import model_config_or_error

    config = model_config_or_error(path, key, "a reward model: " + FIX)
    local = Path(path).expanduser()
    archs = list(getattr(config, "architectures", None) or [])
    if any(a.endswith("ForSequenceClassification") for a in archs):
        if config.num_labels != 1:
            raise ConfigError(f"{key}={path!r} is a classifier of {config.num_labels} labels ({archs[0]}), not a "
                              f"reward model of one score; {FIX}")
        return SEQUENCE_CLASSIFIER
    names = _weight_names(path)
    if names is not None and all(k in names for k in VALUE_HEAD_KEYS):
        return VALUE_HEAD
    if names is None and not local.exists() and any(a.endswith("ForCausalLM") for a in archs):
        return VALUE_HEAD  # its weights are not here yet: the actor checks the head once it has them
    raise ConfigError(f"{key}={path!r} is not a reward model: a {', '.join(archs) or config.model_type} checkpoint "
                      f"with no reward head; {FIX}")


def demos_text(demos: Sequence[Comparison]) -> str:
    """The demonstrations as the text a reward model reads before the prompt."""
    lines = ["Preferences to follow, shown as pairs of responses:"]
    for i, d in enumerate(demos, 1):
        lines += [f"Example {i}", f"Prompt: {d.prompt}", f"Preferred: {d.chosen}", f"Rejected: {d.rejected}"]
    return "\n".join(lines)


def reward_input(tokenizer: Any, prompt: str, completion: str, row: dict[str, Any], where: str) -> str:
    """The text a reward model scores: the row's conversation (``row["messages"]`` when it has one,
    else the prompt as the user's turn) and the completion as the assistant's, through the
    tokenizer's chat template (plain text when it has none), with the row's demos before the
    first user turn. ``where`` names the row in errors about its demos."""
    demos = demos_from_rows(row.get("demos"), where)
    messages = [dict(m) for m in row.get("messages") or [{"role": "user", "content": prompt}]]
    if demos:
        first = next((m for m in messages if m["role"] == "user"), messages[0])
        # Before the first user turn, not as a system turn: every chat template has a user role.
        first["content"] = f"{demos_text(demos)}\n\n{first['content']}"
    messages.append({"role": "assistant", "content": completion})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return "\n\n".join(m["content"] for m in messages)


class RewardModel:
    """A frozen reward model that scores each row of a Batch (the ``"reward"`` role, ``reward.kind=model``)."""

    def __init__(self, path: str, dtype: str = "float32", device: str = "cpu", batch_size: int = 16,
                 max_length: int | None = None) -> None:
        configure_threads()
        if dtype not in DTYPES:
            raise ConfigError(f"reward.dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
        self.name = path
        self.kind = reward_model_kind(path)
        self.device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        self.model, self.head, self.tokenizer = self._load(path, DTYPES[dtype])
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_length = max_length or limit

    def _load(self, path: str, dtype: torch.dtype) -> tuple[Any, torch.nn.Module | None, Any]:
        from transformers import AutoModel, AutoModelForSequenceClassification

        from troupe.actors.models import _quiet_transformers, load_tokenizer

        _quiet_transformers()
        where = str(Path(path).expanduser()) if Path(path).expanduser().exists() else path
        tok = load_tokenizer(where)
        # Right padding keeps every row's positions as they are alone; the score is read at the
        # last real token, and the prompt is cut from the left so the completion is always read.
        tok.padding_side, tok.truncation_side = "right", "left"
        head = None
        if self.kind == SEQUENCE_CLASSIFIER:
            model = AutoModelForSequenceClassification.from_pretrained(where, dtype=dtype)
            if model.config.pad_token_id is None:  # its pooling finds the last token by the pad id
                model.config.pad_token_id = tok.pad_token_id
        else:
            model = AutoModel.from_pretrained(where, dtype=dtype)
            names = _weight_names(path)  # now downloaded, for a hub id
            if names is None or not all(k in names for k in VALUE_HEAD_KEYS):
                raise ConfigError(f"reward.path={path!r} is not a reward model: no value head in its weights; {FIX}")
            head = torch.nn.Linear(model.config.hidden_size, 1, dtype=dtype)
            head.load_state_dict(_read_tensors(path, VALUE_HEAD_KEYS, ("weight", "bias")))
            head.to(self.device).eval()
        return model.to(self.device).eval(), head, tok

    def texts(self, batch: Batch | list[Any]) -> list[str]:
        """The text each row of ``batch`` is scored on (the demos of its row in context)."""
        batch = as_batch(batch)
        return [reward_input(self.tokenizer, p, c, row, f"reward row {i}")
                for i, (p, c, row) in enumerate(zip(batch["prompt"], batch["completion"], batch["row"], strict=True))]

    @torch.no_grad()
    def score_texts(self, texts: list[str]) -> torch.Tensor:
        """One float32 reward per text, ``batch_size`` texts per forward pass."""
        out = []
        for lo in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[lo:lo + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=self.max_length is not None, max_length=self.max_length,
                                 add_special_tokens=False).to(self.device)
            if self.head is None:
                r = self.model(**enc).logits[:, 0]
            else:
                hidden = self.model(**enc).last_hidden_state
                last = enc["attention_mask"].sum(1) - 1  # right padding: the last real token
                r = self.head(hidden[torch.arange(len(last), device=hidden.device), last])[:, 0]
            out.append(r.float().cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def score(self, batch: Batch | list[Any]) -> dict[str, Any]:
        """``{"rewards": [B] float tensor, "errors": [], "extras": {}}``, as `RuleReward.score`; a row
        whose demos are malformed raises a DataError naming the row and the key."""
        return {"rewards": self.score_texts(self.texts(batch)), "errors": [], "extras": {}}


def _read_tensors(path: str, keys: Sequence[str], names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Tensors ``keys`` of a checkpoint (sharded or not, safetensors or a torch .bin), renamed ``names``."""
    index = _model_file(path, "model.safetensors.index.json")
    out = {}
    for key, name in zip(keys, names, strict=True):
        if index is not None:
            shard = json.loads(Path(index).read_text())["weight_map"][key]
            file = str(Path(index).parent / shard)
        else:
            file = _model_file(path, "model.safetensors")
        if file is not None:
            from safetensors import safe_open

            with safe_open(file, framework="pt") as f:
                out[name] = f.get_tensor(key)
        else:
            legacy = torch.load(_model_file(path, "pytorch_model.bin"), map_location="cpu", mmap=True,
                                weights_only=True)
            out[name] = legacy[key]
    return out
