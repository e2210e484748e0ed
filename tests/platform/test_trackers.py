"""Experiment trackers: each gets the rows of metrics.jsonl at their steps and the config, offline,
and a resumed run goes on in the same tracker run; on an algorithm that needs no Ray cluster."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from troupe import Run
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json
from troupe.platform.config import RunConfig
from troupe.platform.errors import ConfigError
from troupe.platform.registry import ALGORITHMS, TRACKERS
from troupe.platform.trackers import Tracker
from troupe.platform.trackers.base import flatten


@dataclasses.dataclass
class CountConfig:
    stride: float = 0.5
    fail_at: int = -1  # a step that raises, to check the trackers close on errors
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(
        steps=4, eval_every=2, checkpoint_every=2, progress=False, trackers=[]))


class Count(Algorithm):
    """A counter that moves by ``stride`` a step; its state is checkpointed."""

    Config = CountConfig
    summary_line = "counts"
    needs_ray = False

    def __init__(self, config: CountConfig, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.position = 0.0

    def step(self, step: int) -> dict[str, Any]:
        if step == self.config.fail_at:
            raise RuntimeError(f"step {step} failed")
        self.position += self.config.stride
        return {"position": self.position, "note": "not a number", "count": step}

    def evaluate(self, step: int) -> dict[str, float]:
        return {"distance": abs(self.position)}

    def save(self, ckpt_dir):
        atomic_write_json(ckpt_dir / "count.json", {"position": self.position})

    def load(self, ckpt_dir):
        self.position = json.loads((ckpt_dir / "count.json").read_text())["position"]

    @classmethod
    def report(cls, config: CountConfig, run: Any, history: list[dict[str, Any]]) -> Report:
        return Report({}, [])


ALGORITHMS.register("count_tracker_test", Count)


class ListTracker(Tracker):
    """A user's own tracker: keeps what it is given."""

    made: list[ListTracker] = []

    def __init__(self) -> None:
        self.started: tuple[Path, dict[str, Any], bool] | None = None
        self.rows: list[dict[str, Any]] = []
        self.closed = False
        ListTracker.made.append(self)

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        self.started = (run_dir, config, resume)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.rows.append({"step": step, **metrics})

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def offline_tracker_env(monkeypatch, tmp_path):
    """The trackers' defaults, with wandb's own folders (settings, caches) kept in the test's."""
    for name in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # Unset, but restored to unset afterwards: the mlflow tracker sets it for its file store.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")


def series(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] of its numeric values, in the order logged."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for k, v in row.items():
            if k != "step" and isinstance(v, int | float):
                out.setdefault(k, []).append((row["step"], v))
    return out


def jsonl(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def wandb_records(path: Path) -> list[Any]:
    """The records of a ``.wandb`` file: a LevelDB-style log (32 KiB blocks of chunks, each with a
    7-byte header: CRC, length, type) of `wandb_internal_pb2.Record` protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        buf = chunk if kind in (1, 2) else buf + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


def wandb_run(folder: Path) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """An offline wandb run folder's id, config and history rows (``step`` = wandb's ``_step``)."""
    (path,) = folder.glob("run-*.wandb")
    run_id, config, rows = "", {}, []
    for r in wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run_id = r.run.run_id
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            rows.append({"step": row.pop("_step"), **{k: v for k, v in row.items() if not k.startswith("_")}})
    config.pop("_wandb", None)
    return run_id, config, rows


def mlflow_client(run_dir: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient((run_dir / "mlruns").resolve().as_uri())


def mlflow_series(run_dir: Path, keys: list[str]) -> tuple[str, dict[str, list[tuple[int, float]]]]:
    run_id = json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"]
    client = mlflow_client(run_dir)
    return run_id, {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def test_wandb_and_mlflow_get_the_series_of_metrics_jsonl_and_the_config_offline(tmp_path):
    out = tmp_path / "run"
    with Run("count_tracker_test", out=out, overrides=["run.trackers=[tensorboard,wandb,mlflow]"]) as run:
        run.run()
    expected = series(jsonl(out))
    assert set(expected) == {"position", "count", "time/step_s", "eval/distance"}
    assert expected["eval/distance"] == [(0, 0.0), (2, 1.0), (4, 2.0)]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["run"]["trackers"] == ["tensorboard", "wandb", "mlflow"]

    (folder,) = (out / "wandb").glob("offline-run-*")
    run_id, wandb_config, history = wandb_run(folder)
    assert run_id == json.loads((out / "trackers.json").read_text())["wandb"]["id"]
    assert wandb_config == config
    assert series(history) == expected

    mlflow_id, logged = mlflow_series(out, list(expected))
    assert logged == {k: sorted(v) for k, v in expected.items()}
    run_info = mlflow_client(out).get_run(mlflow_id)
    assert run_info.data.params == {k: v if isinstance(v, str) else json.dumps(v) for k, v in flatten(config).items()}
    assert run_info.info.status == "FINISHED" and run_info.info.run_name == "run"

    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_a_resumed_run_goes_on_in_the_same_mlflow_and_wandb_runs(tmp_path):
    out = tmp_path / "run"
    trackers = "run.trackers=[wandb,mlflow]"
    with Run("count_tracker_test", out=out, overrides=[trackers, "run.steps=2"]) as run:
        run.run()
    first_ids = json.loads((out / "trackers.json").read_text())
    with Run("count_tracker_test", resume=out, overrides=["run.steps=4"]) as run:
        run.run()
    assert json.loads((out / "trackers.json").read_text()) == first_ids

    expected = series(jsonl(out))
    assert [s for s, _ in expected["position"]] == [0, 1, 2, 3]
    run_id, logged = mlflow_series(out, list(expected))
    assert run_id == first_ids["mlflow"]["run_id"]
    assert logged == {k: sorted(v) for k, v in expected.items()}
    client = mlflow_client(out)
    assert len(client.search_runs([client.get_experiment_by_name("troupe").experiment_id])) == 1
    assert client.get_run(run_id).data.params["run.steps"] == "2"  # MLflow params keep their first value

    # Offline, the resumed part is a second folder under the same wandb id, with the later steps.
    parts = [wandb_run(f) for f in sorted((out / "wandb").glob("offline-run-*"))]
    assert [p[0] for p in parts] == [first_ids["wandb"]["id"]] * 2
    assert parts[1][1]["run"]["steps"] == 4
    assert series(parts[0][2] + parts[1][2]) == expected


def test_a_users_tracker_by_import_path_gets_every_row_and_closes_on_errors(tmp_path):
    ListTracker.made.clear()
    path = f"{__name__}:ListTracker"
    with Run("count_tracker_test", out=tmp_path / "ok", overrides=[f"run.trackers=[{path}]"]) as run:
        run.run()
    (tracker,) = ListTracker.made
    run_dir, config, resume = tracker.started
    assert run_dir == tmp_path / "ok" and resume is False
    assert config == yaml.safe_load((tmp_path / "ok" / "config.yaml").read_text())
    assert tracker.rows == jsonl(tmp_path / "ok") and tracker.closed

    with pytest.raises(RuntimeError, match="step 1 failed"):
        with Run("count_tracker_test", out=tmp_path / "bad", overrides=[f"run.trackers=[{path}]", "fail_at=1"]) as run:
            run.run()
    assert ListTracker.made[-1].closed and [r["step"] for r in ListTracker.made[-1].rows] == [0, 0]


def test_an_unknown_tracker_is_a_config_error_naming_the_key_and_the_registered_trackers(tmp_path):
    with pytest.raises(ConfigError, match=r"^run\.trackers='nope': unknown tracker 'nope'; "
                                          r"registered: .*mlflow, tensorboard, wandb"):
        Run("count_tracker_test", out=tmp_path / "run", overrides=["run.trackers=[tensorboard,nope]"])
    assert not (tmp_path / "run").exists()


class NeedsMissingPackage(Tracker):
    requires = "troupe_no_such_package"
    extra = "no_such_extra"


TRACKERS.register("missing_package_test", NeedsMissingPackage)


def test_a_tracker_whose_package_is_missing_fails_before_the_run_starts_naming_the_extra(tmp_path):
    with pytest.raises(ConfigError, match=r"'missing_package_test' needs the 'troupe_no_such_package' package.*"
                                          r"pip install 'troupe\[no_such_extra\]'"):
        Run("count_tracker_test", out=tmp_path / "run", overrides=["run.trackers=[missing_package_test]"])
    assert not (tmp_path / "run").exists()


def test_the_default_tracker_is_tensorboard():
    assert RunConfig().trackers == ["tensorboard"]
