"""The SFT fit's loss on the answer by row group: exact window means, a row's loss the model's
own summed over its answer, and recording it leaves the fitted weights unchanged."""

from __future__ import annotations

import json

import numpy as np
import torch

from troupe.algorithms.bpo.algorithm import sft_loss_table
from troupe.algorithms.sft import GroupLoss, ModelConfig, SFTConfig, fit_sft, prepare_policy, row_losses
from troupe.envs.arithmetic import ArithmeticTask


def test_group_windows_average_each_groups_rows_and_mark_absent_groups():
    g = GroupLoss()
    g.add(["a", "b", "a"], [1.0, 2.0, 3.0])
    g.add([None, "a"], [9.0, 5.0])  # an ungrouped row counts for no group
    g.close(100)
    g.close(100)  # the same step twice: one window
    g.add(["c"], [0.5])
    g.close(150)
    g.close(160)  # no grouped row since the last window: nothing
    assert g.as_dict() == {"every": 100, "steps": [100, 150],
                           "groups": {"a": [3.0, None], "b": [2.0, None], "c": [None, 0.5]}}


def test_a_rows_loss_is_the_models_own_loss_summed_over_its_answer_tokens():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[-100, -100, 3, 4, 1], [-100, -100, -100, 2, 1]])
    out = row_losses(logits, labels)
    for i, tokens in enumerate((3, 2)):
        mean = torch.nn.functional.cross_entropy(logits[i, :-1], labels[i, 1:], ignore_index=-100)
        assert abs(out[i] - tokens * mean.item()) < 1e-5
    # A uniform guess over k options on a one-token answer scores ln k.
    flat = row_losses(torch.zeros(1, 3, 5), torch.tensor([[-100, -100, 2]]))
    assert abs(flat[0] - np.log(5)) < 1e-6


class Grouped:
    """The arithmetic task's rows, grouped by their answer's parity."""

    def __init__(self) -> None:
        self.inner = ArithmeticTask().sft_task()

    def sample(self, n, split, rng):
        return [{**r, "group": "even" if int(str(r["answer"]).strip() or 0) % 2 == 0 else "odd"}
                for r in self.inner.sample(n, split, rng)]

    def corpus(self, n=4000, seed=0):
        return self.inner.corpus(n, seed)


def test_a_grouped_fit_records_its_loss_by_group_and_fits_the_same_weights(tmp_path):
    cfg = ModelConfig(sft=SFTConfig(steps=6, batch_size=8))
    plain = fit_sft(cfg, ArithmeticTask().sft_task(), tmp_path / "plain")
    grouped = fit_sft(cfg, Grouped(), tmp_path / "grouped")
    assert "loss_by_group" not in plain
    curve = grouped["loss_by_group"]
    assert curve["steps"] == [6] and set(curve["groups"]) <= {"even", "odd"} and curve["groups"]
    assert all(v[0] > 0 for v in curve["groups"].values())
    assert grouped["final_loss"] == plain["final_loss"]
    from safetensors.torch import load_file

    a, b = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "grouped" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_prepare_passes_the_curve_on_fitted_or_cached_and_the_report_shows_it(tmp_path):
    cfg = ModelConfig(cache_dir=str(tmp_path), sft=SFTConfig(steps=4, batch_size=4))
    for expected in ("fitted", "cached"):
        info: dict = {}
        path = prepare_policy(cfg, Grouped(), {"task": "grouped"}, info)
        assert info["sft"] == expected
        assert info["sft_loss_by_group"] == json.loads((path / "sft.json").read_text())["loss_by_group"]
    curve = {"every": 100, "steps": list(range(100, 1100, 100)),
             "groups": {"order": list(np.linspace(1.1, 0.2, 10).round(3)), "null": [None] * 9 + [0.5]}}
    lines = sft_loss_table(curve, columns=4)
    assert lines[3] == "| question type | step 100 | step 400 | step 700 | step 1000 |"
    assert lines[5] == "| order | 1.100 | 0.800 | 0.500 | 0.200 |"
    assert lines[6] == "| null | – | – | – | 0.500 |"
    short = {"every": 100, "steps": [100, 200, 300], "groups": {"order": [1.0, 0.5, 0.25]}}
    assert sft_loss_table(short)[3] == "| question type | step 100 | step 200 | step 300 |"  # fewer than columns: all
    assert sft_loss_table(None) == []
