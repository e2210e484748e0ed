"""ICRM as the reward of an RL run (``reward.kind=icrm``, ALGORITHMS.md §C.2 "Use as RL reward").

Each row carries its demonstrations (``row["demos"]``: the persona a user steers the reward model
to) and, for the pairwise rewards, a reference response (``row[reference]``). Per completion y:

* ``mu``: μ(y ≻ y_ref; C) = σ(r(x, y; C) − r(x, y_ref; C)), in (0, 1);
* ``r``: the per-response reward r(x, y; C) alone;
* ``conservative``: E_q log p = ψ(α) − ψ(α + β) for the pair (y, y_ref), ≤ 0, saturating: a
  finite τ bounds what over-optimising can gain.

The model is read from a directory `TextICRM.save` wrote (``RUN/models/icrm`` of an icrm run).
A path that does not exist yet is read at the first call, so a run can declare this role before
the reward model it will use has been fitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from troupe.actors.base import configure_threads
from troupe.actors.scorer import as_batch
from troupe.algorithms.icrm import posterior
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError, DataError
from troupe.platform.preference_rows import demos_from_rows

ESTIMATES = ("mu", "r", "conservative")


class ICRMReward:
    """A frozen `TextICRM` that scores each row of a Batch (the ``"reward"`` role)."""

    def __init__(self, path: str, estimate: str = "mu", reference: str = "reference", device: str = "cpu",
                 batch_size: int = 64) -> None:
        configure_threads()
        if estimate not in ESTIMATES:
            raise ConfigError(f"reward.icrm_estimate={estimate!r}: expected one of {ESTIMATES}")
        self.path, self.estimate, self.reference, self.batch_size = path, estimate, reference, batch_size
        self.device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = None
        if Path(path).expanduser().exists():
            self._load()

    def _load(self) -> Any:
        from troupe.algorithms.icrm.text import load_text_icrm

        if self.model is None:
            self.model = load_text_icrm(self.path, "reward.path", self.device)
        return self.model

    def rows_input(self, batch: Batch) -> tuple[list, list[str], list[str], list[str]]:
        """(demos, prompts, completions, references) of every row, or a DataError naming the row."""
        demos, refs = [], []
        for i, row in enumerate(batch["row"]):
            demos.append(demos_from_rows(row.get("demos"), f"reward row {i}"))
            ref = row.get(self.reference)
            if self.estimate != "r" and not (isinstance(ref, str) and ref):
                raise DataError(f"reward row {i}: no reference response under {self.reference!r} (reward.icrm_estimate="
                                f"{self.estimate} compares each completion with it); give each row a "
                                f"{self.reference!r} text, set reward.icrm_reference to its key, or use "
                                "reward.icrm_estimate=r")
            refs.append(ref if isinstance(ref, str) else "")
        return demos, list(batch["prompt"]), list(batch["completion"]), refs

    @torch.no_grad()
    def score(self, batch: Batch | list[Any]) -> dict[str, Any]:
        """``{"rewards": [B] float tensor, "errors": [], "extras": {"icrm_tau": [B]}}``, as `RuleReward.score`."""
        model = self._load()
        batch = as_batch(batch)
        demos, prompts, completions, refs = self.rows_input(batch)
        rewards, taus = [], []
        for lo in range(0, len(prompts), self.batch_size):
            sl = slice(lo, lo + self.batch_size)
            b_refs = refs[sl] if self.estimate != "r" else completions[sl]  # r: the pair's other side is unused
            out = model.pair(demos[sl], prompts[sl], completions[sl], b_refs)
            if self.estimate == "mu":
                rewards.append(out["mu"])
            elif self.estimate == "r":
                rewards.append(out["r_a"])
            else:
                rewards.append(posterior.conservative_reward(out["alpha"], out["beta"]))
            taus.append(out["tau"])
        cat = (lambda xs: torch.cat(xs).float().cpu()) if rewards else (lambda xs: torch.zeros(0))
        return {"rewards": cat(rewards), "errors": [], "extras": {"icrm_tau": cat(taus)}}
