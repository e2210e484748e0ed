"""The driver: preparation, the loop, checkpoints and resume, and a report rebuilt from files,
on an algorithm that needs no Ray cluster."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from troupe import Run
from troupe.cli import main
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json
from troupe.platform.config import RunConfig, registered
from troupe.platform.errors import ConfigError
from troupe.platform.registry import ALGORITHMS, REWARDS


@dataclasses.dataclass
class WalkConfig:
    stride: float = 1.0
    reward: str = registered("arithmetic_exact", REWARDS)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=4, eval_every=2, checkpoint_every=2))


class Walk(Algorithm):
    """A position that moves by ``stride`` a step; its state is checkpointed."""

    Config = WalkConfig
    summary_line = "walks"
    needs_ray = False
    progress_metrics = ("position",)
    prepared_calls = 0

    def __init__(self, config: WalkConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.position = 0.0

    def prepare(self) -> dict[str, Any]:
        Walk.prepared_calls += 1
        return {"start": self.position}

    def step(self, step: int) -> dict[str, float]:
        self.position += self.config.stride
        return {"position": self.position}

    def evaluate(self, step: int) -> dict[str, float]:
        return {"distance": abs(self.position)}

    def save(self, ckpt_dir):
        atomic_write_json(ckpt_dir / "walk.json", {"position": self.position})

    def load(self, ckpt_dir):
        self.position = json.loads((ckpt_dir / "walk.json").read_text())["position"]

    @classmethod
    def report(cls, config: WalkConfig, run: Any, history: list[dict[str, Any]]) -> Report:
        last = max((r["position"] for r in history if "position" in r), default=0.0)
        return Report({"final_position": last, "start": run.prepared().get("start")},
                      [f"## Walk result\n\nreached {last}"])


ALGORITHMS.register("walk_test", Walk)


def test_a_run_prepares_steps_evaluates_checkpoints_and_reports(tmp_path):
    with Run("walk_test", out=tmp_path / "run", overrides=["run.progress=false"]) as run:
        summary = run.run()
    out = tmp_path / "run"
    assert summary["final_position"] == 4.0 and summary["start"] == 0.0
    prepared = json.loads((out / "prepare.json").read_text())
    assert prepared["start"] == 0.0 and prepared["seconds"] >= 0
    evals = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval/distance" in r]
    assert [(r["step"], r["eval/distance"]) for r in evals] == [(0, 0.0), (2, 2.0), (4, 4.0)]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    report = (out / "report.md").read_text()
    assert report.index("## Walk result") < report.index("## Plots") < report.index("## Metrics: first and last")


def test_resume_continues_from_the_last_checkpoint_with_the_same_metrics(tmp_path):
    with Run("walk_test", out=tmp_path / "full", overrides=["run.progress=false", "run.steps=6"]) as run:
        run.run()
    # Interrupted after step 4 of 6 (a checkpoint and an evaluation are due there; the run
    # stops before step 5, never finishing), then resumed.
    with Run("walk_test", out=tmp_path / "part", overrides=["run.progress=false", "run.steps=6"]) as run:
        run.evaluate()  # as `run` does first
        for _ in range(4):
            run.step()
    assert not (tmp_path / "part" / "summary.json").exists()
    with Run("walk_test", resume=tmp_path / "part") as run:
        assert run.step_index == 4 and run.algo.position == 4.0
        run.run()

    def rows(d):
        return [{k: v for k, v in r.items() if not k.startswith("time/")}
                for r in map(json.loads, (tmp_path / d / "metrics.jsonl").read_text().splitlines())]

    assert rows("part") == rows("full")


def test_a_bad_registered_name_fails_before_the_algorithm_is_built(tmp_path):
    before = Walk.prepared_calls
    with pytest.raises(ConfigError, match=r"^reward='no_such_reward': unknown reward 'no_such_reward'; registered: "):
        Run("walk_test", out=tmp_path / "run", overrides=["reward=no_such_reward"])
    assert Walk.prepared_calls == before and not (tmp_path / "run").exists()


def test_troupe_report_rebuilds_the_report_from_the_run_directory_alone(tmp_path, capsys):
    out = tmp_path / "run"
    with Run("walk_test", out=out, overrides=["run.progress=false"]) as run:
        first = run.run()
    (out / "report.md").unlink()
    (out / "summary.json").write_text(json.dumps({"algorithm": "walk_test", "faults": 0, "wall_s": 1.5}))
    assert main(["report", str(out)]) == 0
    rebuilt = json.loads((out / "summary.json").read_text())
    assert rebuilt["final_position"] == first["final_position"] and rebuilt["wall_s"] == 1.5
    assert "## Walk result" in (out / "report.md").read_text()


def test_a_run_kept_at_a_uri_mirrors_there_resumes_from_there_and_reports_there(tmp_path, monkeypatch, capsys):
    """run.out as a storage URI (file:// standing for s3:// or gs://): the run works in a local
    copy, everything lands at the URI, the copy is removed, and --resume, report and fetch
    read from the URI alone."""
    staging = tmp_path / "staging"
    monkeypatch.setenv("TROUPE_STAGING_DIR", str(staging))
    with Run("walk_test", out=tmp_path / "full", overrides=["run.progress=false", "run.steps=6"]) as run:
        run.run()
    shared = tmp_path / "shared"
    uri = f"file://{shared}/runs"
    with Run("walk_test", overrides=["run.progress=false", "run.steps=4", f"run.out={uri}"]) as run:
        summary = run.run()
        assert run.run_dir.is_relative_to(staging) and run.location.startswith(uri + "/walk_test-")
    assert summary["run_dir"] == run.location and not run.run_dir.exists()
    (remote,) = (shared / "runs").iterdir()
    assert {"config.yaml", "metrics.jsonl", "report.md", "summary.json", "prepare.json"} <= {
        p.name for p in remote.iterdir()}
    assert (remote / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    assert sorted(p.name for p in (remote / "checkpoints").iterdir()) == ["latest", "step-00000002", "step-00000004"]
    assert not [p for p in remote.rglob("*") if p.name.endswith(".tmp")]

    with Run("walk_test", resume=f"file://{remote}", overrides=["run.steps=6"]) as run:
        assert run.step_index == 4 and run.algo.position == 4.0 and run.location == f"file://{remote}"
        run.run()

    def rows(d):
        return [{k: v for k, v in r.items() if not k.startswith("time/")}
                for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]

    assert rows(remote) == rows(tmp_path / "full")
    assert sorted(p.name for p in (remote / "checkpoints").iterdir()) == ["latest", "step-00000004", "step-00000006"]
    assert not list(staging.iterdir())  # every local copy is gone

    (remote / "report.md").unlink()
    assert main(["report", f"file://{remote}"]) == 0
    assert "## Walk result" in (remote / "report.md").read_text()
    assert main(["fetch", f"file://{remote}", str(tmp_path / "here"), "--checkpoints", "latest"]) == 0
    here = tmp_path / "here"
    assert rows(here) == rows(remote) and (here / "checkpoints" / "latest").read_text().strip() == "step-00000006"
    assert sorted(p.name for p in (here / "checkpoints").iterdir()) == ["latest", "step-00000006"]
    assert "fetched" in capsys.readouterr().out


def test_a_run_that_fails_keeps_what_it_wrote_at_its_uri(tmp_path, monkeypatch):
    monkeypatch.setenv("TROUPE_STAGING_DIR", str(tmp_path / "staging"))
    uri = f"file://{tmp_path}/shared/run"
    with Run("walk_test", out=uri, overrides=["run.progress=false", "run.steps=10"]) as run:
        run.step()
        run.step()
        run.checkpoint()
        run.step()  # after the checkpoint: pushed when the run closes, not lost with the local copy
    rows = [json.loads(line) for line in (tmp_path / "shared" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "position" in r] == [0, 1, 2]
    assert (tmp_path / "shared" / "run" / "checkpoints" / "step-00000002" / "walk.json").is_file()


def test_an_unknown_storage_scheme_is_refused_naming_run_out(tmp_path):
    with pytest.raises(ConfigError, match=r"run.out = 'ftp://host/runs'.*s3://"):
        Run("walk_test", overrides=["run.out=ftp://host/runs"])
    with pytest.raises(ConfigError, match=r"--resume 'file://.*/nothing': no config.yaml there"):
        Run("walk_test", resume=f"file://{tmp_path}/nothing")


def test_a_new_run_refuses_a_directory_that_holds_one(tmp_path, monkeypatch):
    # A second run there would append to the first's metrics; resuming it is what --resume is for.
    monkeypatch.setenv("TROUPE_STAGING_DIR", str(tmp_path / "staging"))
    for where in (tmp_path / "run", f"file://{tmp_path}/shared/run"):
        with Run("walk_test", out=where, overrides=["run.progress=false", "run.steps=2"]) as run:
            run.run()
        with pytest.raises(ConfigError, match=r"--out '.*run' already holds a run \(config.yaml, metrics.jsonl\); "
                                              r"pass --resume .*run to continue it"):
            Run("walk_test", out=where, overrides=["run.progress=false"])
        with Run("walk_test", resume=where, overrides=["run.steps=3"]) as run:
            run.run()
            assert run.step_index == 3


def test_a_run_inside_a_jobs_temporary_working_directory_is_warned_about(tmp_path, monkeypatch, caplog):
    job_dir = tmp_path / "session" / "runtime_resources" / "working_dir_files" / "_ray_pkg_1"
    job_dir.mkdir(parents=True)
    monkeypatch.chdir(job_dir)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what Ray sets in a job's driver
    with caplog.at_level("WARNING", logger="troupe"), Run("walk_test", overrides=["run.progress=false"]) as run:
        run.run()
    assert "temporary working directory" in caplog.text and "run.out" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="troupe"), Run(
            "walk_test", overrides=["run.progress=false", f"run.out=file://{tmp_path}/shared"]) as run:
        run.run()
    assert "temporary working directory" not in caplog.text


def _comparable_rows(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith("time/")}
            for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def _killed_while_writing_checkpoint(run_dir, steps_before):
    """A walk_test run that dies while writing the checkpoint due after ``steps_before`` steps, as
    a SIGKILL leaves it: the checkpoint's temporary folder half written, nothing moved into place."""
    from troupe.platform.checkpoint import CheckpointDir

    class Killed(BaseException):
        pass

    with Run("walk_test", out=run_dir, overrides=["run.progress=false", "run.steps=6"]) as run:
        def killed_mid_write():
            tmp = CheckpointDir(run.ctx.checkpoints_dir).temporary(run.step_index)
            run.algo.save(tmp)  # the algorithm's files written; driver.json never is
            raise Killed

        run.evaluate()  # as `run` does first
        for _ in range(steps_before - 1):
            run.step()
        run.checkpoint = killed_mid_write
        with pytest.raises(Killed):
            run.step()  # its metrics and the evaluation due with it are logged, then the kill


def test_resume_of_a_run_killed_while_writing_its_first_checkpoint_starts_again_from_step_0(tmp_path):
    with Run("walk_test", out=tmp_path / "full", overrides=["run.progress=false", "run.steps=6"]) as run:
        run.run()
    part = tmp_path / "part"
    _killed_while_writing_checkpoint(part, steps_before=2)
    ckpts = part / "checkpoints"
    assert [p.name for p in ckpts.iterdir()][0].startswith(".step-00000002.")  # only the half-written one
    assert [r["step"] for r in _comparable_rows(part)] == [0, 0, 1, 2]

    with Run("walk_test", resume=part) as run:
        assert run.step_index == 0 and run.algo.position == 0.0
        assert not list(ckpts.glob(".step-*"))  # the temporary folder is gone
        assert not (part / "metrics.jsonl").read_text()  # its rows are redone from the start
        summary = run.run()
    assert _comparable_rows(part) == _comparable_rows(tmp_path / "full")
    assert summary["restarts"] == 1 and summary["resumes"] == 1 and summary["final_position"] == 6.0
    assert json.loads((part / "summary.json").read_text())["restarts"] == 1
    assert "started again from step 0" in (part / "report.md").read_text()
    assert (ckpts / "latest").read_text().strip() == "step-00000006"


def test_troupe_run_resume_of_a_run_with_no_complete_checkpoint_starts_it_again(tmp_path):
    part = tmp_path / "part"
    _killed_while_writing_checkpoint(part, steps_before=2)
    assert main(["run", "walk_test", "--resume", str(part)]) == 0
    assert json.loads((part / "summary.json").read_text())["final_position"] == 6.0
    assert [r["step"] for r in _comparable_rows(part) if "position" in r] == [0, 1, 2, 3, 4, 5]


def test_every_resume_removes_stale_temporary_checkpoints_and_the_report_counts_it(tmp_path):
    with Run("walk_test", out=tmp_path / "full", overrides=["run.progress=false", "run.steps=6"]) as run:
        run.run()
    part = tmp_path / "part"
    _killed_while_writing_checkpoint(part, steps_before=4)  # the checkpoint at 2 is complete
    assert sorted(p.name[:15] for p in (part / "checkpoints").glob(".step-*")) == [".step-00000004."]
    with Run("walk_test", resume=part) as run:
        assert run.step_index == 2 and run.algo.position == 2.0
        assert not list((part / "checkpoints").glob(".step-*"))
        summary = run.run()
    assert _comparable_rows(part) == _comparable_rows(tmp_path / "full")
    assert summary["resumes"] == 1 and summary["restarts"] == 0
    report = (part / "report.md").read_text()
    assert "Resumed 1 time (from step 2)." in report and "started again" not in report
    (part / "report.md").unlink()
    assert main(["report", str(part)]) == 0  # a rebuilt report counts it too
    assert "Resumed 1 time (from step 2)." in (part / "report.md").read_text()
