"""Prompt datasets: rows with the fields a task requires, read through the ``datasets`` library
from a local JSONL, JSON, CSV or Parquet file, a folder written by ``datasets.Dataset.save_to_disk``,
or a split of a hub dataset.

Chat rows: a prompt may be a list of ``{"role", "content"}`` turns (roles system, user,
assistant). Such a row, and every row when a system prompt is set, leaves `prompt_rows` with
``"messages"``, the turns the engines render with the tokenizer's chat template, and
``"prompt"``, their text joined by blank lines: the plain-text fallback for a tokenizer
without a template. A plain prompt is one user turn and needs no ``"messages"`` (a column of
that name is dropped from such a row). A trailing assistant turn is the reference reply,
never part of the prompt: it is the answer when the row has no answer field, and is dropped
when it has one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from troupe.platform.errors import DataError

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}  # suffix -> datasets builder
ROLES = ("system", "user", "assistant")
LOCAL_KINDS = "a .jsonl, .json, .csv or .parquet file, or a folder written by datasets.Dataset.save_to_disk"


class PromptDataset:
    """Rows (dicts) with at least ``required`` fields; sampled reproducibly by a generator."""

    def __init__(self, rows: list[dict], required: Sequence[str] = ("prompt",), source: str = "<memory>") -> None:
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DataError(f"{source}: row {i} is not an object: {row!r}")
            missing = [k for k in required if k not in row]
            if missing:
                raise DataError(
                    f"{source}: row {i} lacks required field(s) {missing}; it has {sorted(row)}. "
                    f"Every row needs {list(required)}."
                )
        if not rows:
            raise DataError(f"{source}: the dataset is empty (no rows); give one with at least one row")
        self.rows = rows
        self.source = source

    @classmethod
    def from_jsonl(cls, path: str | Path, required: Sequence[str] = ("prompt",)) -> PromptDataset:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"dataset file {str(path)!r} does not exist")
        rows = []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not valid JSON: {e}") from e
        return cls(rows, required, str(path))

    def __len__(self) -> int:
        return len(self.rows)

    def sample(self, n: int, rng: np.random.Generator) -> list[dict]:
        idx = rng.integers(len(self.rows), size=n)
        return [self.rows[int(i)] for i in idx]


def is_local(source: str) -> bool:
    """Whether ``source`` names a local path rather than a hub dataset id (``name`` or ``owner/name``)."""
    path = Path(source).expanduser()
    return (path.exists() or source.startswith(("/", ".", "~")) or source.count("/") > 1
            or path.suffix.lower() in FORMATS)


def read_table(source: str, split: str = "train", subset: str | None = None,
               split_key: str = "task.split") -> list[dict[str, Any]]:
    """The records of ``source``: a local file (by its suffix, see `FORMATS`), a ``save_to_disk``
    folder, or else a hub dataset id. ``split`` picks the split of a hub dataset or of a saved
    ``DatasetDict`` (``split_key`` is the config key that set it); ``subset`` is a hub dataset's
    configuration name."""
    import datasets

    datasets.disable_progress_bars()  # a bar per file and split would drown the run's own progress
    path = Path(source).expanduser()
    if path.is_dir():
        table = _from_disk(datasets, source, path, split, split_key)
    elif path.is_file():
        builder = FORMATS.get(path.suffix.lower())
        if builder is None:
            raise DataError(f"dataset file {source!r}: unknown format {path.suffix or '(no suffix)'!r}; "
                            f"accepted: {LOCAL_KINDS}, or a hub dataset id")
        if path.stat().st_size == 0:
            raise DataError(f"dataset file {source!r} is empty (no rows); give one with at least one row")
        try:
            table = datasets.load_dataset(builder, data_files=str(path), split="train")
        except Exception as e:  # the library's own parse errors, of many types
            if "corresponds to no data" in str(e):  # how the library says a file has no rows
                raise DataError(f"dataset file {source!r}: the dataset is empty (no rows); give one with at "
                                "least one row") from e
            raise DataError(f"dataset file {source!r}: cannot read it as {path.suffix} ({type(e).__name__}: {e})") from e
    elif is_local(source):
        raise DataError(f"dataset file {source!r} does not exist; give {LOCAL_KINDS}, or a hub dataset id")
    else:
        table = _from_hub(datasets, source, split, subset)
    return table.to_list()


def _from_disk(datasets: Any, source: str, path: Path, split: str, split_key: str) -> Any:
    try:
        table = datasets.load_from_disk(str(path))
    except FileNotFoundError as e:
        raise DataError(f"dataset folder {source!r} was not written by datasets.Dataset.save_to_disk ({e}); "
                        f"accepted: {LOCAL_KINDS}") from e
    if isinstance(table, datasets.DatasetDict):
        if split not in table:
            raise DataError(f"dataset folder {source!r} has the splits {list(table)}, not {split!r}: "
                            f"set {split_key} to one of them")
        table = table[split]
    return table


def _from_hub(datasets: Any, source: str, split: str, subset: str | None) -> Any:
    try:
        return datasets.load_dataset(source, subset, split=split)
    except Exception as e:  # offline, unknown id, unknown split: the library raises many types
        raise DataError(
            f"cannot load the hub dataset {source!r} (split {split!r}): {type(e).__name__}: {e}. There is no "
            f"local file or folder of that name; without a network (or with HF_HUB_OFFLINE=1) only a dataset "
            f"already in the local cache loads: give a local path instead, {LOCAL_KINDS}") from e


def prompt_rows(records: list[dict[str, Any]], source: str, fields: Mapping[str, str] | None = None,
                system_prompt: str | None = None) -> PromptDataset:
    """Rows ``{"prompt", "answer", "messages", ...}`` from a table's records: columns renamed by
    ``fields`` (troupe field → column, e.g. ``{"prompt": "question"}``), the chat turns checked
    (see the module doc) and ``system_prompt`` added as a system turn to a row without one."""
    if not records:
        raise DataError(f"{source}: the dataset is empty (no rows); give one with at least one row")
    fields = dict(fields or {})
    columns = list(records[0])
    for field, column in fields.items():
        if column not in columns:
            raise DataError(f"{source}: task.fields.{field}={column!r} names no column of the dataset; "
                            f"its columns: {columns}")
    if "prompt" not in fields and "prompt" not in set(columns) - set(fields.values()):
        raise DataError(f"{source}: no 'prompt' column; its columns: {columns}. Map one with "
                        f"task.fields.prompt=COLUMN")
    renamed = {*fields, *fields.values()}
    rows = []
    for i, record in enumerate(records):
        row = {k: v for k, v in record.items() if k not in renamed}
        row.update({field: record[column] for field, column in fields.items()})
        row = chat_row(row, i, source, system_prompt)
        if row.get("answer") is None:
            raise DataError(f"{source}: row {i} lacks required field(s) ['answer']; it has {sorted(record)}. "
                            "Map a column with task.fields.answer=COLUMN, or end the row's messages with "
                            "an assistant turn")
        rows.append(row)
    return PromptDataset(rows, ("prompt", "answer"), source)


def chat_row(row: dict[str, Any], i: int, source: str, system_prompt: str | None = None) -> dict[str, Any]:
    """``row`` (number ``i`` of ``source``) with its prompt as checked chat turns in ``"messages"``
    and as plain text in ``"prompt"``; a trailing assistant turn becomes the answer if it has none."""
    prompt = row.get("prompt")
    if isinstance(prompt, str) and not system_prompt:
        # One user turn, as the engines render a row without messages; a column that happens
        # to be called "messages" must not be taken for the prompt.
        return {k: v for k, v in row.items() if k != "messages"}
    if isinstance(prompt, str):
        turns = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list | tuple):
        turns = [_turn(t, i, j, source) for j, t in enumerate(prompt)]
        if turns and turns[-1]["role"] == "assistant":
            reply = turns.pop()["content"]
            if row.get("answer") is None:
                row = {**row, "answer": reply}
        if not turns:
            raise DataError(f"{source}: row {i}: its messages hold no turn before the answer; give at least "
                            "one user turn")
    else:
        raise DataError(f"{source}: row {i}: the prompt is {prompt!r}; expected a string or a list of "
                        "{role, content} turns")
    if system_prompt and turns[0]["role"] != "system":
        turns.insert(0, {"role": "system", "content": system_prompt})
    return {**row, "prompt": "\n\n".join(t["content"] for t in turns), "messages": turns}


def _turn(turn: Any, i: int, j: int, source: str) -> dict[str, str]:
    if not isinstance(turn, Mapping) or "role" not in turn or "content" not in turn:
        raise DataError(f"{source}: row {i}: messages turn {j} is {turn!r}; expected {{'role', 'content'}}")
    role, content = turn["role"], turn["content"]
    if role not in ROLES:
        raise DataError(f"{source}: row {i}: messages turn {j} has the role {role!r}; allowed roles: "
                        f"{', '.join(ROLES)}")
    if not isinstance(content, str):
        raise DataError(f"{source}: row {i}: messages turn {j} ({role}) has content {content!r}; expected a "
                        "string (text turns only)")
    return {"role": role, "content": content}
