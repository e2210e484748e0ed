"""Atomic writes and checkpoints: a crash mid-write never leaves a half file where a good one was.

A checkpoint is a folder ``step-<N>/`` holding safetensors weights and JSON state; it is
written under a temporary name and renamed into place, and ``latest`` names the newest
complete one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # numpy is a dependency; this only guards odd environments
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def save_state_dict(path: str | Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> None:
    """Save torch tensors as safetensors, atomically."""
    from safetensors.torch import save

    flat = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write_bytes(path, save(flat, metadata=metadata))


def load_state_dict(path: str | Path, prefix: str = "") -> dict[str, Any]:
    """The torch tensors of a safetensors file, in their stored dtype; with ``prefix``, only the
    keys that start with it (the rest of the file is never read)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}


class CheckpointDir:
    """The ``checkpoints/`` folder of a run: ``step-<N>/`` folders and a ``latest`` pointer."""

    def __init__(self, root: str | Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = keep

    def write(self, step: int, fill: Callable[[Path], None]) -> Path:
        """Call ``fill(tmp_dir)`` to write the files, then move the folder into place atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step-{step:08d}"
        tmp = self.temporary(step)
        try:
            fill(tmp)
            _fsync_dir(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic_write_text(self.root / "latest", final.name + "\n")
        self._prune()
        return final

    def temporary(self, step: int) -> Path:
        """A new temporary folder for the checkpoint of ``step`` (``.step-<N>.<random>.tmp``),
        where `write` puts the files before it moves the folder into place."""
        self.root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=self.root, prefix=f".step-{step:08d}.", suffix=".tmp"))

    def partials(self) -> list[Path]:
        """The temporary folders that a writer killed mid-write left behind."""
        return sorted(self.root.glob(".step-*.tmp"))

    def remove_partials(self) -> list[str]:
        """Remove every temporary folder left by a crash mid-write; return their names."""
        names = []
        for stale in self.partials():
            shutil.rmtree(stale, ignore_errors=True)
            names.append(stale.name)
        return names

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if pointer.is_file():
            candidate = self.root / pointer.read_text().strip()
            if candidate.is_dir():
                return candidate
        done = sorted(p for p in self.root.glob("step-*") if p.is_dir())
        return done[-1] if done else None

    def names(self) -> list[str]:
        """The complete ``step-<N>`` folders, oldest first."""
        return sorted(p.name for p in self.root.glob("step-*") if p.is_dir())

    def _prune(self) -> None:
        done = sorted(p for p in self.root.glob("step-*") if p.is_dir())
        for old in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)
        self.remove_partials()


def build_directory(final: str | Path, build: Callable[[Path], Any]) -> Any:
    """Build the directory ``final`` in a temporary sibling with ``build(tmp)`` and move it into
    place, so that a reader never sees half of it; when another process moved its own there
    first, theirs is kept (both were built from the same key). Returns what ``build`` returned."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    try:
        out = build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished first: theirs is as good
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
