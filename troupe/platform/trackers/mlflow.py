"""MLflow: a file store in ``run_dir/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from troupe.platform.trackers.base import Tracker, flatten, load_tracker_state, numbers, save_tracker_state

log = logging.getLogger("troupe")

_PARAMS_PER_BATCH = 100  # MLflow's limits on one log_batch call
_METRICS_PER_BATCH = 1000
_PARAM_VALUE_CHARS = 6000


class MlflowTracker(Tracker):
    """An MLflow run named after the run directory, in experiment ``$MLFLOW_EXPERIMENT_NAME``
    (default ``troupe``): the flattened config as params (``run.steps``), every row as metrics
    at troupe's step.

    The store is ``$MLFLOW_TRACKING_URI`` when set, else ``file:`` ``run_dir/mlruns`` (view it
    with ``mlflow ui --backend-store-uri file:RUN_DIR/mlruns``; MLflow 3 keeps file stores
    behind ``MLFLOW_ALLOW_FILE_STORE``, which this default sets). The run id is kept in
    ``run_dir/trackers.json``; ``--resume`` appends to that run. Params cannot change in MLflow:
    a resumed run adds new keys and keeps the first value of a changed one (config.yaml holds
    the new one). Characters MLflow refuses in a key become ``_``.
    """

    requires = "mlflow"
    extra = "mlflow"

    def __init__(self) -> None:
        self.client: Any = None
        self.run_id: str | None = None
        self.tracking_uri: str | None = None

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (Path(run_dir) / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.tracking_uri = uri
        self.client = MlflowClient(uri)
        params = {_key(k): _param_value(v) for k, v in flatten(config).items()}
        self.run_id = load_tracker_state(run_dir, "mlflow").get("run_id") if resume else None
        if self.run_id is not None and self._reopen(params):
            return
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "troupe"
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=Path(run_dir).name).info.run_id
        save_tracker_state(run_dir, "mlflow", {"run_id": self.run_id})
        self._log_params(params)

    def _reopen(self, params: dict[str, str]) -> bool:
        """Continue the kept run; False (a new run) when this store does not hold it."""
        from mlflow.exceptions import MlflowException

        try:
            logged = self.client.get_run(self.run_id).data.params
        except MlflowException as e:
            log.warning("mlflow: run %s is not in %s (%s); starting a new run", self.run_id, self.tracking_uri, e)
            return False
        self.client.update_run(self.run_id, status="RUNNING")
        changed = sorted(k for k in params if k in logged and logged[k] != params[k])
        if changed:
            log.warning("mlflow: params keep their first values (config.yaml has the new ones): %s",
                        ", ".join(changed))
        self._log_params({k: v for k, v in params.items() if k not in logged})
        return True

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i:i + _PARAMS_PER_BATCH])

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        items = [Metric(_key(k), float(v), stamp, step) for k, v in numbers(metrics).items()]
        for i in range(0, len(items), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + _METRICS_PER_BATCH])

    def close(self) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id)
        self.client = None


def _key(name: str) -> str:
    """A metric or param name MLflow accepts: letters, digits, ``_ - . / : space``."""
    return re.sub(r"[^\w\-./: ]", "_", name)


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:_PARAM_VALUE_CHARS]
