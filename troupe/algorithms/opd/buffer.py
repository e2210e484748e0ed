"""The aggregation buffer of NE-OPD (DAgger's data set) and the offline arms' trajectories.

One actor keeps a data set per arm: every (state, target) the arm was given — the student's
roll-ins with the teacher's targets at every position, or the teacher's own trajectories —
and draws the rows of each update from it. Its contents are part of a checkpoint, so a
resumed run trains on exactly the data the uninterrupted one would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from troupe.actors.scorer import as_batch
from troupe.platform.batch import Batch
from troupe.platform.checkpoint import atomic_write_json, load_state_dict, save_state_dict

# What an update reads; the rest of a rollout's Batch (texts, versions) stays out of the buffer.
FIELDS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs", "targets", "target_ids",
          "targets_topk_ids", "targets_topk_logprobs", "teacher_logprobs")


class DistillBuffer:
    """Per-arm data sets of rows with targets, appended to and sampled from."""

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity  # rows kept per arm, the oldest dropped first; 0 keeps all
        # Each arm's data set as the chunks it was given: appending copies nothing, and a draw
        # gathers only the rows it takes.
        self.data: dict[str, list[Batch]] = {}

    def add(self, key: str, batch: Batch | list[Any], ids_only: bool = False) -> int:
        """Append ``batch``'s rows to ``key``'s data set; returns its size. ``ids_only`` keeps
        the teacher's most likely token at each position instead of its whole distribution
        (all that a hard-target loss reads, a vocabulary's width less to keep)."""
        batch = as_batch(batch)
        tensors = {k: v for k, v in batch.tensors.items() if k in FIELDS}
        if ids_only and "targets" in tensors:
            tensors["target_ids"] = tensors.pop("targets").argmax(-1)
        if ids_only and "targets_topk_ids" in tensors:
            tensors["target_ids"] = tensors.pop("targets_topk_ids")[..., 0]  # topk sorts: the mode first
            tensors.pop("targets_topk_logprobs")
        chunks = self.data.setdefault(key, [])
        # Fields in one order, here and after a reload, so that any chunks concatenate.
        chunks.append(Batch(dict(sorted(tensors.items())), {"row": batch.objects["row"]} if "row" in batch.objects else {}))
        while self.capacity and self.size(key) - len(chunks[0]) >= self.capacity:
            chunks.pop(0)
        if self.capacity and self.size(key) > self.capacity:
            chunks[0] = chunks[0].select(slice(self.size(key) - self.capacity, None))
        return self.size(key)

    def size(self, key: str) -> int:
        return sum(len(c) for c in self.data.get(key, []))

    def sample(self, key: str, n: int, seed: int) -> Batch:
        """``n`` rows of ``key``'s data set, drawn without replacement (all of them when it holds
        fewer), by a generator seeded with ``seed``: the same draw on a resumed run."""
        if key not in self.data:
            raise KeyError(f"the buffer has no data for {key!r}; it holds {sorted(self.data)}")
        chunks = self.data[key]
        rng = np.random.default_rng(seed)
        idx = np.sort(rng.permutation(self.size(key))[: min(n, self.size(key))])
        starts = np.cumsum([0] + [len(c) for c in chunks])
        parts = []
        for i, c in enumerate(chunks):
            own = idx[(idx >= starts[i]) & (idx < starts[i + 1])] - starts[i]
            if len(own):
                parts.append(c.select(own.tolist()))
        return Batch.concat(parts)

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, directory: str) -> bool:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        tensors = {f"{key}/{i}/{name}": t.contiguous() for key, chunks in self.data.items()
                   for i, b in enumerate(chunks) for name, t in b.tensors.items()}
        save_state_dict(d / "buffer.safetensors", tensors)
        atomic_write_json(d / "buffer.json", {
            "chunks": {key: [b.objects.get("row", []) for b in chunks] for key, chunks in self.data.items()}})
        return True

    def load(self, directory: str) -> bool:
        import json

        d = Path(directory)
        meta = json.loads((d / "buffer.json").read_text())
        tensors = load_state_dict(d / "buffer.safetensors")
        self.data = {}
        for key, rows in meta["chunks"].items():
            self.data[key] = []
            for i, chunk_rows in enumerate(rows):
                prefix = f"{key}/{i}/"
                own = dict(sorted((name[len(prefix):], t) for name, t in tensors.items() if name.startswith(prefix)))
                self.data[key].append(Batch(own, {"row": chunk_rows} if chunk_rows else {}))
        return True

