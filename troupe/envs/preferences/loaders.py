"""Loaders of three multi-attribute preference datasets, in their published file formats, into an
`AttributeSet` (responses grouped by prompt, a score per attribute). Each reads a local file
(JSONL, JSON, CSV, Parquet), a ``save_to_disk`` folder, or a hub id, through
`troupe.envs.datasets.read_table` and the ``datasets`` library:

* **HelpSteer2** (``nvidia/HelpSteer2``): a row per response, ``prompt``, ``response`` and the
  integer scores 0–4 ``helpfulness``, ``correctness``, ``coherence``, ``complexity``, ``verbosity``;
  rows with the same prompt are one group (the dataset has two responses per prompt);
* **UltraFeedback** (``openbmb/UltraFeedback``): a row per prompt, ``instruction`` and
  ``completions``, each completion ``{"response", "annotations": {aspect: {"Rating": "1".."5"}}}``
  with the aspects ``instruction_following``, ``honesty``, ``truthfulness``, ``helpfulness``; a
  rating ``"N/A"`` is no score (NaN);
* **PKU-SafeRLHF** (``PKU-Alignment/PKU-SafeRLHF``): a row per pair, ``prompt``, ``response_0``,
  ``response_1``, ``better_response_id`` and ``safer_response_id`` (0 or 1) and
  ``is_response_0_safe``, ``is_response_1_safe``. Its attributes are ``helpful`` (1 for the better
  response, 0 for the other), ``harmless`` (1 for the safer) and ``safe`` (the safety flag), so
  that the objective {helpful: 1} is the dataset's helpfulness preference and {harmless: 1} its
  harmlessness one. Each row is its own group: the same prompt in two rows pairs other responses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from troupe.envs.datasets import read_table
from troupe.envs.preferences.attributes import AttributeSet, ResponseGroup, group_rows
from troupe.platform.errors import ConfigError, DataError

HELPSTEER2_ATTRIBUTES = ("helpfulness", "correctness", "coherence", "complexity", "verbosity")
ULTRAFEEDBACK_ATTRIBUTES = ("instruction_following", "honesty", "truthfulness", "helpfulness")
SAFERLHF_ATTRIBUTES = ("helpful", "harmless", "safe")
HUB_IDS = {"helpsteer2": "nvidia/HelpSteer2", "ultrafeedback": "openbmb/UltraFeedback",
           "pku_saferlhf": "PKU-Alignment/PKU-SafeRLHF"}
ATTRIBUTES_OF = {"helpsteer2": HELPSTEER2_ATTRIBUTES, "ultrafeedback": ULTRAFEEDBACK_ATTRIBUTES,
                 "pku_saferlhf": SAFERLHF_ATTRIBUTES}


def _field(record: Mapping[str, Any], key: str, where: str, expected: str) -> Any:
    if key not in record or record[key] is None:
        raise DataError(f"{where} lacks {key!r} ({expected}); it has {sorted(record)}")
    return record[key]


def _text(record: Mapping[str, Any], key: str, where: str) -> str:
    value = _field(record, key, where, "a string")
    if not isinstance(value, str):
        raise DataError(f"{where}: {key}={value!r} is not a string")
    return value


def _score(value: Any, where: str, key: str) -> float:
    if isinstance(value, str):
        if value.strip().upper() in ("N/A", "NA", ""):
            return math.nan
        try:
            return float(value)
        except ValueError:
            pass
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise DataError(f"{where}: {key}={value!r} is not a number (or 'N/A')")


def load_helpsteer2(source: str = HUB_IDS["helpsteer2"], split: str = "train",
                    subset: str | None = None) -> AttributeSet:
    """HelpSteer2 rows (a response each, five 0–4 scores) grouped by prompt."""
    rows = []
    for i, r in enumerate(read_table(source, split, subset, split_key="data.split")):
        where = f"{source}: row {i}"
        scores = [_score(_field(r, a, where, "a 0-4 score"), where, a) for a in HELPSTEER2_ATTRIBUTES]
        rows.append((_text(r, "prompt", where), _text(r, "response", where), scores))
    return group_rows(rows, HELPSTEER2_ATTRIBUTES, source)


def load_ultrafeedback(source: str = HUB_IDS["ultrafeedback"], split: str = "train",
                       subset: str | None = None) -> AttributeSet:
    """UltraFeedback rows (an instruction, its completions with a rating per aspect), one group each."""
    groups = []
    for i, r in enumerate(read_table(source, split, subset, split_key="data.split")):
        where = f"{source}: row {i}"
        prompt = _text(r, "instruction", where)
        completions = _field(r, "completions", where, "a list of {response, annotations}")
        if not isinstance(completions, list):
            raise DataError(f"{where}: completions={completions!r} is not a list of {{response, annotations}}")
        responses, scores = [], []
        for j, c in enumerate(completions):
            at = f"{where}: completions[{j}]"
            if not isinstance(c, Mapping):
                raise DataError(f"{at} is {c!r}; expected {{response, annotations}}")
            annotations = _field(c, "annotations", at, f"a rating per aspect {list(ULTRAFEEDBACK_ATTRIBUTES)}")
            row = []
            for a in ULTRAFEEDBACK_ATTRIBUTES:
                aspect = annotations.get(a) if isinstance(annotations, Mapping) else None
                if not isinstance(aspect, Mapping) or "Rating" not in aspect:
                    raise DataError(f"{at}: annotations lack {a!r} with a 'Rating'; every completion needs "
                                    f"{list(ULTRAFEEDBACK_ATTRIBUTES)}")
                row.append(_score(aspect["Rating"], at, f"annotations.{a}.Rating"))
            responses.append(_text(c, "response", at))
            scores.append(row)
        if len(responses) >= 2:
            groups.append(ResponseGroup(prompt, tuple(responses), np.array(scores, dtype=float)))
    return AttributeSet(ULTRAFEEDBACK_ATTRIBUTES, groups, source)


def _binary(r: Mapping[str, Any], key: str, where: str) -> int:
    value = _field(r, key, where, "0 or 1")
    if isinstance(value, bool) or (isinstance(value, int | float) and value in (0, 1)):
        return int(value)
    raise DataError(f"{where}: {key}={value!r} is not 0 or 1")


def load_pku_saferlhf(source: str = HUB_IDS["pku_saferlhf"], split: str = "train",
                      subset: str | None = None) -> AttributeSet:
    """PKU-SafeRLHF pairs, each with the attributes helpful, harmless and safe of its two responses."""
    groups = []
    for i, r in enumerate(read_table(source, split, subset, split_key="data.split")):
        where = f"{source}: row {i}"
        pair = (_text(r, "response_0", where), _text(r, "response_1", where))
        better, safer = _binary(r, "better_response_id", where), _binary(r, "safer_response_id", where)
        safe = [_binary(r, f"is_response_{j}_safe", where) for j in (0, 1)]
        scores = np.array([[float(better == j), float(safer == j), float(safe[j])] for j in (0, 1)])
        groups.append(ResponseGroup(_text(r, "prompt", where), pair, scores))
    return AttributeSet(SAFERLHF_ATTRIBUTES, groups, source)


LOADERS: dict[str, Callable[..., AttributeSet]] = {
    "helpsteer2": load_helpsteer2, "ultrafeedback": load_ultrafeedback, "pku_saferlhf": load_pku_saferlhf}


def load_attribute_set(name: str, source: str | None = None, split: str = "train",
                       subset: str | None = None) -> AttributeSet:
    """The dataset ``name`` (a key of `LOADERS`, ``data.source`` of `troupe run icrm`) from ``source``,
    default its hub id."""
    if name not in LOADERS:
        raise ConfigError(f"data.source={name!r}: unknown preference dataset; known: {sorted(LOADERS)}")
    return LOADERS[name](source or HUB_IDS[name], split, subset)
