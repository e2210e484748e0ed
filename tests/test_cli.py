"""The `troupe` command's errors: one clear line naming the bad input, exit code 2, no traceback."""

import subprocess
import sys

import pytest

from troupe.cli import main


def test_list_shows_algorithms_and_presets(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "grpo" in out and "smoke" in out


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
        (["run", "grpo", "reward.on_error=maybe"], "'reward.on_error'"),
        (["report", "/no/such/run"], "is not a run directory"),
        (["run", "grpo", "--resume", "/no/such/run"], "no config.yaml there"),
    ],
)
def test_bad_input_gets_one_clear_error(args, message, capsys, monkeypatch, tmp_path, troupe_cache):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("troupe: error:")


def test_print_config_applies_overrides(capsys):
    assert main(["run", "grpo", "--preset", "smoke", "--print-config", "learner.lr=0.01"]) == 0
    assert '"lr": 0.01' in capsys.readouterr().out


def test_the_console_script_prints_no_traceback():
    out = subprocess.run([sys.executable, "-m", "troupe.cli", "run", "grpo", "learner.lrr=1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "learner.lrr" in out.stderr
