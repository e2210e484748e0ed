"""SFT trains where the model is configured to run (``model.device``) and saves a CPU checkpoint."""

from __future__ import annotations

import pytest

from troupe.actors.models import load_causal_lm
from troupe.algorithms.sft import ModelConfig, SFTConfig, fit_sft
from troupe.envs.arithmetic import ArithmeticTask


def _fit(device: str, out) -> dict:
    return fit_sft(ModelConfig(device=device, sft=SFTConfig(steps=5, batch_size=8)), ArithmeticTask().sft_task(), out)


def test_auto_fits_on_the_cpu_without_a_gpu_and_the_checkpoint_loads(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = _fit("auto", tmp_path)
    assert info["sft_steps"] == 5 and info["final_loss"] > 0
    model, _ = load_causal_lm(str(tmp_path))
    assert {p.device.type for p in model.parameters()} == {"cpu"}


@pytest.mark.gpu
def test_sft_trains_on_the_gpu_and_saves_a_cpu_checkpoint(tmp_path):
    info = _fit("cuda", tmp_path)
    assert info["final_loss"] > 0
    model, _ = load_causal_lm(str(tmp_path))
    assert {p.device.type for p in model.parameters()} == {"cpu"}


def test_stop_loss_ends_the_fit_once_the_mean_of_the_last_20_losses_is_below_it(tmp_path):
    """A threshold above any loss stops after the first 20 steps; one below none runs them all.
    Only a set threshold enters the cache key, so checkpoints fitted before it keep theirs."""
    from troupe.algorithms.sft import _key_fields

    cfg = ModelConfig(sft=SFTConfig(steps=30, batch_size=4, stop_loss=1e6))
    assert fit_sft(cfg, ArithmeticTask().sft_task(), tmp_path / "a")["sft_steps"] == 20
    assert "stop_loss" not in _key_fields(ModelConfig())["sft"]
    assert _key_fields(cfg)["sft"]["stop_loss"] == 1e6
    with pytest.raises(ValueError, match="model.sft.stop_loss"):
        SFTConfig(stop_loss=0.0)


def test_prepare_reports_the_sft_steps_that_ran_when_stop_loss_ends_the_fit(tmp_path):
    """`prepare.json` gets the steps the fit took, fitted or from the cache, not the cap."""
    from troupe.algorithms.sft import prepare_policy

    cfg = ModelConfig(cache_dir=str(tmp_path), sft=SFTConfig(steps=30, batch_size=4, stop_loss=1e6))
    task = ArithmeticTask()
    for expected in ("fitted", "cached"):
        info: dict = {}
        prepare_policy(cfg, task.sft_task(), {"task": "arithmetic"}, info)
        assert (info["sft"], info["sft_steps"]) == (expected, 20)
