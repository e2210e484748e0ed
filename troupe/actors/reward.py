"""Rule rewards: a Python function per row, named by registry or as ``module:function``.

A function is called as ``fn(completion=..., prompt=..., **row)`` and returns a float, or a
dict with ``"reward"`` and further numbers a step may use (parsed answers, confidences),
returned per row as tensors under ``"extras"``. A parameter named like a tensor field of the
Batch (``option_logprobs``, ``logprobs``, ...) receives that row's tensor. A row whose reward raises is reported with its index, prompt and error; ``on_error`` decides
whether that stops the step (``"raise"``) or scores the row with a number and counts it.
"""

from __future__ import annotations

import inspect
import math
import traceback
from collections.abc import Mapping
from typing import Any

import torch

from troupe.actors.scorer import as_batch
from troupe.platform.batch import Batch
from troupe.platform.errors import DataError
from troupe.platform.registry import REWARDS


class RuleReward:
    """Scores each row of a Batch with a rule function."""

    def __init__(self, fn: str, on_error: str | float = "raise", kwargs: dict[str, Any] | None = None) -> None:
        self.name = fn
        self.fn = REWARDS.get(fn)
        if not callable(self.fn):
            raise DataError(f"reward {fn!r} resolves to {self.fn!r}, which is not callable")
        self.on_error = on_error
        self.kwargs = kwargs or {}
        try:
            self.params = set(inspect.signature(self.fn).parameters)
        except (TypeError, ValueError):  # a builtin or C callable: no tensor fields asked for
            self.params = set()

    def score(self, batch: Batch | list[Any]) -> dict[str, Any]:
        """``{"rewards": [B] float tensor, "errors": [{row, prompt, error}], "extras": {name: [B]}}``."""
        batch = as_batch(batch)
        rewards, errors = [], []
        extras: dict[str, list[float]] = {}
        fields = [k for k in batch.tensors if k in self.params]
        for i, (prompt, completion, row) in enumerate(zip(batch["prompt"], batch["completion"], batch["row"], strict=True)):
            try:
                out = self.fn(**{**row, **self.kwargs, **{k: batch[k][i] for k in fields},
                                 "completion": completion, "prompt": prompt})
                if isinstance(out, Mapping):
                    for k, v in out.items():
                        if k != "reward":
                            extras.setdefault(k, [math.nan] * i).append(float(v))
                    out = out["reward"]
                r = float(out)
                if not math.isfinite(r):
                    raise ValueError(f"reward is not finite: {r}")
            except Exception as e:  # a user's reward may fail in any way: report the row
                errors.append({"row": i, "prompt": prompt, "completion": completion,
                               "error": f"{type(e).__name__}: {e}",
                               "where": traceback.format_exc(limit=-1).strip().splitlines()[-1]})
                r = math.nan
            rewards.append(r)
            for v in extras.values():  # a failed row has no extras
                v.extend([math.nan] * (len(rewards) - len(v)))
        if errors and self.on_error == "raise":
            first = errors[0]
            raise DataError(
                f"reward {self.name!r} failed on {len(errors)} of {len(rewards)} rows; first: row {first['row']} "
                f"(prompt {first['prompt']!r}, completion {first['completion']!r}): {first['error']}. "
                f"Fix the reward function or set reward.on_error to a number to score such rows with it."
            )
        fill = 0.0 if self.on_error == "raise" else float(self.on_error)
        t = torch.tensor([fill if math.isnan(r) else r for r in rewards], dtype=torch.float32)
        return {"rewards": t, "errors": errors,
                "extras": {k: torch.tensor(v, dtype=torch.float32) for k, v in extras.items()}}
