"""Extending troupe is one new file: a loss, an advantage, a task or an algorithm, each from a
module this test writes to a temporary directory, run through the `troupe` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from troupe.actors.losses import policy_objective
from troupe.platform.config import check_registered, resolve
from troupe.platform.errors import ConfigError

# A loss with a hyperparameter of its own, and an advantage estimator.
USER_LOSSES = '''
import torch
from troupe.actors.losses import PolicyLossOutput


def scaled_pg(logprobs, old_logprobs, advantages, scale=1.0):
    """-scale * rho * A: a plain policy gradient with a hyperparameter of its own."""
    ratio = torch.exp(logprobs - old_logprobs)
    return PolicyLossOutput(-scale * ratio * advantages.unsqueeze(-1), {"ratio/mean": ratio.detach()})


def centred(rewards, group_ids):
    """A_i = r_i - mean(r) over the whole batch."""
    return rewards - rewards.mean()


def wrong_shape(logprobs, old_logprobs, advantages):
    return PolicyLossOutput(logprobs.sum(-1))
'''

# A task of the user's own: prompts with answers, a held-out set, an exact checker.
USER_TASKS = '''
import dataclasses

import numpy as np

from troupe.envs.task import Task


class Sorting(Task):
    """Sort a few digits: "sort 312" -> "123"."""

    @dataclasses.dataclass
    class Config(Task.Config):
        name: str = "sorting"
        length: int = 3

    def _row(self, rng):
        digits = "".join(str(d) for d in rng.integers(0, 10, self.config.length))
        return {"prompt": f"sort {digits}", "answer": "".join(sorted(digits))}

    def train_rows(self, n, rng):
        return [self._row(rng) for _ in range(n)]

    def eval_rows(self, n):
        rng = np.random.default_rng(0)
        return [self._row(rng) for _ in range(n)]

    def checker(self):
        return "exact_match"
'''

# An algorithm in a package of its own, found through its distribution's entry points.
PLUGIN_ALGORITHM = '''
import dataclasses

from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.config import RunConfig


@dataclasses.dataclass
class CountConfig:
    target: int = 3
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=3, eval_every=0, checkpoint_every=0))


class Count(Algorithm):
    """Counts one per step: the smallest algorithm there is."""

    Config = CountConfig
    summary_line = "counts to a target"
    needs_ray = False
    progress_metrics = ("count",)

    def step(self, step):
        return {"count": float(step + 1)}

    @classmethod
    def report(cls, config, run, history):
        reached = max(r.get("count", 0.0) for r in history) >= config.target
        return Report({"reached": reached}, [f"## Count result\\n\\nreached {config.target}: {reached}"])
'''


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return path


def _troupe(args: list[str], pythonpath: Path, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "troupe.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_user_loss_gets_its_own_hyperparameters_and_a_wrong_one_is_named(tmp_path, monkeypatch):
    _write(tmp_path, "user_losses", USER_LOSSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    from troupe.algorithms.grpo.config import GRPOConfig

    cfg = resolve(GRPOConfig, None, None, ["learner.loss=user_losses:scaled_pg", "learner.loss_kwargs.scale=0.5",
                                           "grpo.advantage=user_losses:centred"])
    assert cfg.learner.loss_kwargs == {"scale": 0.5}
    lp = torch.zeros(1, 2, requires_grad=True)
    loss, metrics = policy_objective(cfg.learner.loss, lp, lp.detach(), torch.tensor([2.0]), torch.ones(1, 2),
                                     aggregation="dapo", loss_kwargs=cfg.learner.loss_kwargs)
    assert loss.item() == pytest.approx(-1.0)  # -0.5 * 1 * 2, the token mean
    assert metrics["ratio/mean"] == pytest.approx(1.0)
    with pytest.raises(ConfigError, match=r"learner.loss_kwargs has \['scael'\].*'user_losses:scaled_pg' takes \['scale'\]"):
        resolve(GRPOConfig, None, None, ["learner.loss=user_losses:scaled_pg", "learner.loss_kwargs.scael=0.5"])
    with pytest.raises(TypeError, match="policy loss 'user_losses:wrong_shape' returned a per-token loss of shape"):
        policy_objective("user_losses:wrong_shape", lp, lp.detach(), torch.ones(1), torch.ones(1, 2))


@pytest.mark.parametrize("override, key", [
    ("learner.loss=no_such_loss", "learner.loss"),
    ("learner.aggregation=sum", "learner.aggregation"),
    ("grpo.advantage=nope", "grpo.advantage"),
    ("reward.fn=missing_mod:fn", "reward.fn"),
    ("rollout.backend=tpu", "rollout.backend"),
])
def test_an_unknown_name_is_one_error_naming_the_key_and_the_registered_names(override, key):
    from troupe.algorithms.grpo.config import GRPOConfig

    with pytest.raises(ConfigError) as e:
        check_registered(resolve(GRPOConfig, None, None, [override]))
    assert str(e.value).startswith(f"{key}=") and "\n" not in str(e.value)


def test_an_unknown_algorithm_names_the_registry():
    from troupe.platform.driver import algorithm_class
    from troupe.platform.errors import RegistryError

    with pytest.raises(RegistryError, match=r"unknown algorithm 'grp0'; registered: .*grpo.* \(in ALGORITHMS\)"):
        algorithm_class("grp0")


@pytest.mark.timeout(400)
def test_grpo_trains_a_user_task_with_a_user_loss_and_advantage_from_the_command_line(tmp_path):
    _write(tmp_path, "user_losses", USER_LOSSES)
    _write(tmp_path, "user_tasks", USER_TASKS)
    out = tmp_path / "run"
    done = _troupe(["run", "grpo", "--preset", "smoke", "--out", str(out), "run.progress=false", "run.num_cpus=2",
                    "task.name=user_tasks:Sorting", "task.length=4", "learner.loss=user_losses:scaled_pg",
                    "learner.loss_kwargs.scale=0.5", "grpo.advantage=user_losses:centred", "run.steps=2",
                    "run.eval_every=0", "run.checkpoint_every=0", "model.sft.steps=20", "model.cache_dir=" + str(tmp_path),
                    "eval.num_prompts=8", "grpo.prompts_per_step=2", "rollout.sampling.max_new_tokens=6"],
                   tmp_path, tmp_path, timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    config = (out / "config.yaml").read_text()
    assert "user_tasks:Sorting" in config and "length: 4" in config and "exact_match" in config
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss/policy" in r]
    assert len(trained) == 2 and all("ratio/mean" in r for r in trained)
    prepared = json.loads((out / "prepare.json").read_text())
    assert prepared["sft"] == "fitted" and prepared["model_path"].startswith(str(tmp_path))


def test_a_user_task_by_import_path_gets_its_own_config_section(tmp_path, monkeypatch):
    _write(tmp_path, "user_tasks", USER_TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    from troupe.algorithms.grpo.config import GRPOConfig

    cfg = resolve(GRPOConfig, None, None, ["task.name=user_tasks:Sorting", "task.length=5"])
    assert cfg.task.length == 5 and cfg.reward.fn == "exact_match"
    with pytest.raises(ConfigError, match="task.digits"):
        resolve(GRPOConfig, None, None, ["task.name=user_tasks:Sorting", "task.digits=2"])


@pytest.mark.timeout(300)
def test_a_plugin_package_adds_an_algorithm_through_its_entry_points(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _write(site, "count_plugin", PLUGIN_ALGORITHM)
    info = site / "count_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: count-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[troupe.algorithms]\ncount = count_plugin:Count\n")

    listed = _troupe(["list"], site, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "count" in listed.stdout and "counts to a target" in listed.stdout

    out = tmp_path / "run"
    done = _troupe(["run", "count", "--out", str(out), "run.progress=false", "count_target=2"], site, tmp_path)
    assert done.returncode == 2 and "unknown config key 'count_target'" in done.stderr
    done = _troupe(["run", "count", "--out", str(out), "run.progress=false", "target=2"], site, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "summary.json").read_text())["reached"] is True
    report = (out / "report.md").read_text()
    assert report.index("## Count result") < report.index("## Metrics: first and last")
