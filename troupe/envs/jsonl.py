"""``task.name=jsonl``: the dataset task (`troupe.envs.dataset_task`) under the name it had when
it read JSONL files only; the same class, config and checker."""

from troupe.envs.dataset_task import DatasetTask, exact_match

JsonlTask = DatasetTask

__all__ = ["DatasetTask", "JsonlTask", "exact_match"]
