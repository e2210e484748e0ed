"""The `troupe` command's errors: one clear line naming the bad input, exit code 2, no traceback."""

import subprocess
import sys

import pytest


def troupe(*args):
    return subprocess.run([sys.executable, "-m", "troupe.cli", *args], capture_output=True, text=True, timeout=120)


def test_list_shows_algorithms_and_presets():
    out = troupe("list")
    assert out.returncode == 0 and "grpo" in out.stdout and "smoke" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "nope"], "unknown algorithm 'nope'; registered:"),
        (["run", "grpo", "--preset", "nope"], "unknown preset 'nope'; available:"),
        (["run", "grpo", "learner.lrr=1"], "unknown config key 'learner.lrr'"),
        (["run", "grpo", "learner.lr=fast"], "'learner.lr' = 'fast': expected a number"),
        (["run", "grpo", "model.path=/no/such/model", "model.sft.steps=0"], "model path '/no/such/model' does not exist"),
        (["run", "grpo", "task.dataset=/no/such.jsonl"], "dataset file '/no/such.jsonl' does not exist"),
        (["run", "grpo", "grpo.advantage=nope"], "unknown advantage 'nope'"),
        (["report", "/no/such/run"], "is not a run directory"),
    ],
)
def test_bad_input_gets_one_clear_error(args, message, tmp_path):
    out = troupe(*args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_print_config_applies_overrides():
    out = troupe("run", "grpo", "--preset", "smoke", "--print-config", "learner.lr=0.01")
    assert out.returncode == 0 and '"lr": 0.01' in out.stdout
