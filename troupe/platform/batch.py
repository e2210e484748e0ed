"""`Batch`: the one data-plane type — named tensors sharing a leading batch dimension, plus
per-row Python objects (texts, metadata). It slices, concatenates and pads, and travels
between actors as a Ray object ref (it pickles as plain tensors and lists).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch


class Batch:
    """Named tensors ``[B, ...]`` and per-row objects ``list[Any]`` of length ``B``."""

    __slots__ = ("tensors", "objects", "meta")

    def __init__(
        self,
        tensors: dict[str, torch.Tensor] | None = None,
        objects: dict[str, Sequence[Any]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.objects: dict[str, list[Any]] = {k: list(v) for k, v in (objects or {}).items()}
        self.meta: dict[str, Any] = dict(meta or {})  # batch-level facts (weight version, ...)
        self._check()

    def _check(self) -> None:
        sizes = {k: int(v.shape[0]) for k, v in self.tensors.items() if v.dim() > 0}
        sizes.update({k: len(v) for k, v in self.objects.items()})
        for k, v in self.tensors.items():
            if v.dim() == 0:
                raise ValueError(f"Batch field {k!r} is a scalar; every tensor needs a leading batch dimension")
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch fields disagree on the batch size: {sizes}")

    # -- size and access ------------------------------------------------------
    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for v in self.objects.values():
            return len(v)
        return 0

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.objects

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.objects:
            return self.objects[key]
        raise KeyError(f"Batch has no field {key!r}; fields: {', '.join(self.keys())}")

    def __setitem__(self, key: str, value: Any) -> None:
        n = len(self)
        if isinstance(value, torch.Tensor):
            if self.keys() and value.shape[0] != n:
                raise ValueError(f"Batch field {key!r} has {value.shape[0]} rows, the batch has {n}")
            self.objects.pop(key, None)
            self.tensors[key] = value
        else:
            value = list(value)
            if self.keys() and len(value) != n:
                raise ValueError(f"Batch field {key!r} has {len(value)} rows, the batch has {n}")
            self.tensors.pop(key, None)
            self.objects[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def keys(self) -> list[str]:
        return [*self.tensors, *self.objects]

    def require(self, *keys: str, who: str = "this step") -> None:
        """Raise a clear error if any field ``who`` needs is missing."""
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"{who} needs Batch fields {missing}; the batch has {self.keys()}")

    # -- slicing ---------------------------------------------------------------
    def select(self, index: slice | Sequence[int] | torch.Tensor) -> Batch:
        """Rows by slice, list of indices or boolean/integer tensor."""
        if isinstance(index, slice):
            rows = list(range(len(self)))[index]
        elif isinstance(index, torch.Tensor):
            rows = (index.nonzero().flatten() if index.dtype == torch.bool else index).tolist()
        else:
            rows = list(index)
        idx = torch.as_tensor(rows, dtype=torch.long)
        on = {idx.device: idx}  # the index on each device the tensors live on (a batch on a GPU)
        return Batch(
            {k: v.index_select(0, on.setdefault(v.device, idx.to(v.device))) for k, v in self.tensors.items()},
            {k: [v[i] for i in rows] for k, v in self.objects.items()},
            self.meta,
        )

    def split(self, n_chunks: int) -> list[Batch]:
        """``n_chunks`` contiguous pieces as equal as possible (for DDP ranks)."""
        n = len(self)
        bounds = [round(i * n / n_chunks) for i in range(n_chunks + 1)]
        return [self.select(slice(bounds[i], bounds[i + 1])) for i in range(n_chunks)]

    def chunks(self, size: int) -> Iterator[Batch]:
        for start in range(0, len(self), size):
            yield self.select(slice(start, start + size))

    def with_fields(self, **fields: Any) -> Batch:
        out = Batch(dict(self.tensors), dict(self.objects), self.meta)
        for k, v in fields.items():
            out[k] = v
        return out

    def to(self, device: str | torch.device) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.objects, self.meta)

    # Fields whose padding is not 0: a padded letter log-prob must carry no probability.
    DEFAULT_PADS = {"option_logprobs": float("-inf")}

    @staticmethod
    def concat(batches: Iterable[Batch], pad_values: dict[str, float] | None = None,
               left_pad: Iterable[str] = ("prompt_ids", "prompt_mask")) -> Batch:
        """Stack rows; 2-D tensors of different widths are padded with ``pad_values`` (else 0), on the
        left for the ``left_pad`` fields (left-padded prompts) and on the right for the others."""
        batches = [b for b in batches]
        if not batches:
            return Batch()
        keys_t = list(batches[0].tensors)
        keys_o = list(batches[0].objects)
        for b in batches[1:]:
            if list(b.tensors) != keys_t or list(b.objects) != keys_o:
                raise ValueError(f"cannot concat batches with different fields: {keys_t + keys_o} vs {b.keys()}")
        pad_values = {**Batch.DEFAULT_PADS, **(pad_values or {})}
        left = set(left_pad)
        tensors = {}
        for k in keys_t:
            parts = [b.tensors[k] for b in batches]
            if parts[0].dim() >= 2:
                width = max(p.shape[1] for p in parts)
                pad = pad_left if k in left else pad_right
                parts = [pad(p, width, pad_values.get(k, 0)) for p in parts]
            tensors[k] = torch.cat(parts, 0)
        objects = {k: [x for b in batches for x in b.objects[k]] for k in keys_o}
        return Batch(tensors, objects, batches[0].meta)

    # -- pickling: plain dicts keep it cheap through the object store ----------
    def __getstate__(self) -> tuple:
        # CPU tensors travel as numpy arrays: the object store takes those out of band in one
        # copy, while a pickled torch tensor goes through torch.save, several times slower.
        return ({k: _to_numpy(v) for k, v in self.tensors.items()}, self.objects, self.meta)

    def __setstate__(self, state: tuple) -> None:
        tensors, self.objects, self.meta = state
        # A copy: arrays read from the object store are read-only views of shared memory.
        self.tensors = {k: torch.from_numpy(v.copy()) if isinstance(v, np.ndarray) else v
                        for k, v in tensors.items()}

    def __repr__(self) -> str:
        t = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.tensors.items())
        o = ", ".join(self.objects)
        return f"Batch(n={len(self)}, tensors=[{t}], objects=[{o}])"


def _to_numpy(t: torch.Tensor) -> torch.Tensor | np.ndarray:
    """``t`` as a numpy array where that is exact (a CPU tensor of a dtype numpy has, no autograd)."""
    if t.device.type != "cpu" or t.requires_grad:
        return t
    try:
        return t.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, float8, ...): torch pickles it
        return t


def pad_right(x: torch.Tensor, width: int, value: float = 0) -> torch.Tensor:
    """Right-pad dimension 1 of ``x`` to ``width``."""
    if x.shape[1] >= width:
        return x
    pad = x.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), value)
    return torch.cat([x, pad], 1)


def pad_left(x: torch.Tensor, width: int, value: float = 0) -> torch.Tensor:
    """Left-pad dimension 1 of ``x`` to ``width``."""
    if x.shape[1] >= width:
        return x
    pad = x.new_full((x.shape[0], width - x.shape[1], *x.shape[2:]), value)
    return torch.cat([pad, x], 1)
