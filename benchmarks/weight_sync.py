"""Benchmark: weight sync from a learner to 2 rollout engines vs a plain object-store transfer.

Arms, timed interleaved on one Ray cluster:

- ``troupe``: the object-store path of ``PolicyGraph.sync_weights`` (what a GRPO step does):
  learner rank 0 publishes its weights as numpy buffers, both engines point their parameters at
  those buffers (no copy: an engine only reads its weights);
- ``numpy``: the same weights as numpy arrays, ``ray.put`` by a publisher actor and
  ``ray.get`` by two receiver actors (the transport alone, nothing loaded into a model);
- ``numpy_copy``: the same, each receiver also copying the arrays into buffers of its own (what
  installing the weights by copy costs at least, as a model that trains must);
- ``torch_pickle``: the same as ``numpy``, with the weights as pickled torch tensors;
- ``lora``: a LoRA learner (r=8 on q/k/v/o) publishing only its adapter to two engines.

Goal: troupe_s / numpy_s ≤ 1.5. Also the bytes sent: full weights vs the LoRA adapter.
Writes ``benchmarks/results/weight_sync.json``.

    python benchmarks/weight_sync.py
    python benchmarks/weight_sync.py --sizes 150k --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import common

REPEATS = 15  # timed rounds per size

GOAL = 1.5
ENGINES = 2


class WeightPublisher:
    """Holds a copy of the learner's weights and puts them in the object store on request."""

    def __init__(self, state: dict[str, Any]) -> None:
        import torch

        torch.set_num_threads(1)
        # Copies, so the object store gets buffers this actor owns (as a learner's would be).
        self.tensors = {k: v.clone() for k, v in state.items()}
        self.arrays = {k: v.numpy().copy() for k, v in state.items()}

    def publish(self, as_numpy: bool) -> list[Any]:
        """``[ref]``: a ref nested in a list is passed on unresolved, as a WeightUpdate's is."""
        import ray

        return [ray.put(self.arrays if as_numpy else self.tensors)]

    def nbytes(self) -> int:
        return int(sum(v.nbytes for v in self.arrays.values()))


class WeightReceiver:
    """Fetches published weights: only maps them (``install=False``), or also copies every array
    into buffers it owns, the least that installing them in a model by copy costs."""

    def __init__(self) -> None:
        self.buffers: dict[str, Any] = {}

    def receive(self, published: list[Any], install: bool = False) -> int:
        import numpy as np
        import ray

        state = ray.get(published[0])
        if install:
            for k, v in state.items():
                if k not in self.buffers:
                    self.buffers[k] = np.empty_like(v)
                np.copyto(self.buffers[k], v)
        return int(sum(v.nbytes for v in state.values()))


def bench_size(model: common.BenchModel, repeats: int, warmup: int) -> dict[str, Any]:
    """The five arms on one model size."""
    import ray

    from troupe.actors.learner import Learner
    from troupe.actors.models import load_causal_lm
    from troupe.actors.rollout_hf import HFRolloutEngine
    from troupe.platform.placement import ActorGraph, Role

    learner_kwargs = {"model_path": model.path, "config": {}, "max_len": common.NEW_TOKENS}
    lora_cfg = {"lora": {"enabled": True, "r": 8, "alpha": 16}}
    engine_kwargs = {"model_path": model.path}
    local = load_causal_lm(model.path)[0]
    # The model's parameters, each once (named_parameters skips the tied lm_head alias).
    state = {k: p.detach() for k, p in local.named_parameters()}
    state_dict_bytes = sum(t.nbytes for t in local.state_dict().values())
    roles = [
        Role("learner", Learner, num_cpus=1, kwargs=learner_kwargs),
        Role("rollout", HFRolloutEngine, count=ENGINES, num_cpus=0.5, kwargs=engine_kwargs),
        Role("lora_learner", Learner, num_cpus=0.5, kwargs={**learner_kwargs, "config": lora_cfg}),
        Role("lora_rollout", HFRolloutEngine, count=ENGINES, num_cpus=0.25, kwargs=engine_kwargs),
        Role("publisher", WeightPublisher, num_cpus=0.1, kwargs={"state": state}),
        Role("receiver", WeightReceiver, count=ENGINES, num_cpus=0.1),
    ]
    graph = ActorGraph(roles, timeout_s=300, call_timeout_s=600).start()
    try:
        receivers = graph["receiver"]
        sent: dict[str, set[int]] = {"troupe": set(), "lora": set(), "numpy": set(), "numpy_copy": set(),
                                     "torch_pickle": set()}

        def plain(as_numpy: bool, install: bool = False) -> float:
            name = ("numpy_copy" if install else "numpy") if as_numpy else "torch_pickle"
            t = time.perf_counter()
            published = graph["publisher"][0].publish.remote(as_numpy)
            got = receivers.wait([h.receive.remote(published, install) for h in receivers.handles], "receive")
            dt = time.perf_counter() - t
            sent[name].add(got[0])
            return dt

        def troupe_sync() -> float:
            out = object_store_sync(graph["learner"], graph["rollout"])
            sent["troupe"].add(int(out["sync/bytes"]))
            return out["time/sync_s"]

        def lora_sync() -> float:
            out = object_store_sync(graph["lora_learner"], graph["lora_rollout"])
            sent["lora"].add(int(out["sync/bytes"]))
            return out["time/sync_s"]

        arms = {"troupe": troupe_sync, "numpy": lambda: plain(True), "numpy_copy": lambda: plain(True, install=True),
                "torch_pickle": lambda: plain(False), "lora": lora_sync}
        seconds = common.time_interleaved(arms, repeats, warmup)
        numpy_bytes = ray.get(graph["publisher"][0].nbytes.remote())
    finally:
        graph.shutdown()
    s = {name: common.stats(v) for name, v in seconds.items()}
    receive = receive_cost(model.path, repeats)
    full_bytes, lora_bytes = sent["troupe"].pop(), sent["lora"].pop()
    if full_bytes != numpy_bytes:
        raise RuntimeError(f"troupe sent {full_bytes} bytes, the numpy arm {numpy_bytes}: not the same weights")
    return {
        "parameters": model.parameters,
        "engines": ENGINES,
        "bytes": {"full": full_bytes, "lora_adapter": lora_bytes, "lora_vs_full": lora_bytes / full_bytes,
                  "parameters_x4": 4 * model.parameters, "state_dict_with_tied_alias": state_dict_bytes},
        "seconds_per_sync": s,
        "engine_receive_in_process": receive,
        "ratio_troupe_vs_numpy": common.ratio(s["troupe"], s["numpy"]),
        "paired_ratio_troupe_vs_numpy": common.paired_ratio(seconds["troupe"], seconds["numpy"]),
        "ratio_troupe_vs_numpy_copy": common.ratio(s["troupe"], s["numpy_copy"]),
        "ratio_torch_pickle_vs_numpy": common.ratio(s["torch_pickle"], s["numpy"]),
        "goal": f"troupe_s/numpy_s <= {GOAL}",
        "goal_met": common.ratio(s["troupe"], s["numpy"]) <= GOAL,
    }


def receive_cost(model_path: str, repeats: int) -> dict[str, Any]:
    """In this process: ``ray.get`` of a published update vs troupe's whole receive as a rollout
    engine does it (the get plus pointing every parameter at the update's buffers), and as a
    model that trains does it (the get plus copying every tensor into the model)."""
    import ray

    from troupe.actors.transport import object_store

    model, _ = common.load_model(model_path)
    copied, _ = common.load_model(model_path)
    update = object_store.publish(model.state_dict(), 1)
    arms = {"ray_get": common.timed(lambda: ray.get(update.ref)),
            "receive_shared": common.timed(lambda: object_store.receive(model, update, share=True)),
            "receive_copied": common.timed(lambda: object_store.receive(copied, update))}
    return {k: common.stats(v) for k, v in common.time_interleaved(arms, repeats, 2, log=None).items()}


def object_store_sync(learner: Any, engines: Any) -> dict[str, float]:
    """The object-store path of ``PolicyGraph.sync_weights`` (`ObjectStoreTransport.begin` and
    `end`), call for call: learner rank 0 publishes, every engine loads, the driver reads the
    update's size."""
    t = time.perf_counter()
    update_ref = learner[0].publish_weights.remote("object_store")
    engines.wait([h.load_weights.remote(update_ref) for h in engines.handles], "load_weights")
    nbytes = learner.wait([update_ref], "publish_weights")[0].nbytes
    return {"sync/bytes": float(nbytes), "time/sync_s": time.perf_counter() - t}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_size_arguments(ap, REPEATS, warmup=2)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    results = common.per_size("weight_sync", args.sizes, 1, lambda m: bench_size(
        m, common.repeats_for(m.name, args.repeats, REPEATS), args.warmup))
    rows = []
    for name, r in results.items():
        s, b = r["seconds_per_sync"], r["bytes"]
        rows.append([name, f"{b['full'] / 2**20:.2f}", f"{b['lora_adapter'] / 2**20:.3f}",
                     common.fmt_stats(s["troupe"]), common.fmt_stats(s["numpy"]), common.fmt_stats(s["numpy_copy"]),
                     common.fmt_stats(s["torch_pickle"]), common.fmt_stats(s["lora"]),
                     f"{r['ratio_troupe_vs_numpy']:.2f}", f"{r['paired_ratio_troupe_vs_numpy']['median']:.2f}",
                     "yes" if r["goal_met"] else "no"])
    common.print_table(
        f"weight sync learner → {ENGINES} engines, seconds, median [min–max] of {args.repeats}",
        ["size", "full MiB", "LoRA MiB", "troupe", "numpy put/get", "+ copy", "torch pickle", "troupe LoRA",
         "troupe/numpy", "paired", f"≤ {GOAL}"], rows)
    common.write_result(args.result_name or "weight_sync", {"config": vars(args), "wall_s": round(time.perf_counter() - t0, 1),
                                        "sizes": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
