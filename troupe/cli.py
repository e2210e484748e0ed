"""The `troupe` command: run, list, report, export (and submit, for clusters)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from troupe.platform.errors import TroupeError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="troupe", description="Agents and RL post-training on Ray actor graphs.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run an algorithm", description="Run an algorithm: troupe run ALGO [key=value ...]")
    r.add_argument("algorithm")
    r.add_argument("--preset", default=None, help="a preset of the algorithm (see `troupe list`)")
    r.add_argument("--out", default=None, help="the run directory (default: run.out/<algo>-<time>)")
    r.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its last checkpoint")
    r.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    r.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")

    sub.add_parser("list", help="algorithms and their presets")

    rep = sub.add_parser("report", help="rebuild report.md, plots and summary.json of a run directory")
    rep.add_argument("run_dir")

    ex = sub.add_parser("export", help="write a run's trained policy as a Hugging Face model directory",
                        description="troupe export RUN_DIR OUT [--step N] [--arm NAME] [--merge-lora] [--force]")
    ex.add_argument("run_dir")
    ex.add_argument("out", help="the model directory to write (a PEFT adapter for a LoRA run)")
    ex.add_argument("--step", type=int, default=None, help="the checkpoint's step (default: the latest)")
    ex.add_argument("--arm", default=None, help="the policy of a run with several arms (default: the first "
                    "with 'bpo' in its name)")
    ex.add_argument("--merge-lora", action="store_true", help="a LoRA run: write the merged full model")
    ex.add_argument("--force", action="store_true", help="replace OUT when it exists and is not empty")

    s = sub.add_parser("submit", help="submit a run to a Ray cluster as a job",
                       description="troupe submit --address URL [--follow] -- grpo --preset smoke")
    from troupe.cluster.submit import add_submit_arguments

    add_submit_arguments(s)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may follow options (`--out DIR key=value`), which argparse alone does not allow.
    stray = [a for a in extra if a.startswith("-") or "=" not in a]
    if stray or (extra and args.command != "run"):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "list":
            return _list()
        if args.command == "report":
            return _report(args.run_dir)
        if args.command == "export":
            return _export(args)
        if args.command == "submit":
            from troupe.cluster.submit import submit_main

            return submit_main(args)
    except TroupeError as e:
        print(f"troupe: error: {e}", file=sys.stderr)
        return 2
    return 1


def _run(args: argparse.Namespace) -> int:
    from troupe.platform import config as cfglib
    from troupe.platform import driver

    if args.print_config:
        cfg = driver.resolve_config(args.algorithm, args.preset, args.overrides)
        print(json.dumps(cfglib.to_dict(cfg), indent=2))
        return 0
    if args.resume and args.preset:
        raise TroupeError("--resume takes the config saved in the run directory; drop --preset")
    summary = driver.run(args.algorithm, args.preset, args.overrides, out=args.out, resume=args.resume)
    print(f"\nrun directory: {summary['run_dir']}\nreport: {Path(summary['run_dir']) / 'report.md'}")
    return 0


def _list() -> int:
    from troupe.platform.config import list_presets
    from troupe.platform.registry import ALGORITHMS

    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        presets = ", ".join(list_presets(cls.presets_dir()))
        print(f"{name:10s} {cls.summary_line}\n{'':10s} presets: {presets}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from troupe.algorithms.export import export

    info = export(args.run_dir, args.out, step=args.step, arm=args.arm, merge_lora=args.merge_lora,
                  force=args.force)
    arm = f" ({info['arm']})" if info["arm"] else ""
    what = "PEFT adapter" if info["kind"] == "adapter" else f"{info['dtype']} model"
    print(f"exported the {what} of step {info['step']}{arm} to {info['out']}")
    return 0


def _report(run_dir: str) -> int:
    from troupe.platform import config as cfglib
    from troupe.platform.driver import algorithm_class
    from troupe.platform.metrics import read_metrics
    from troupe.platform.report import write_report
    from troupe.platform.run import RunContext

    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise TroupeError(f"{run_dir!r} is not a run directory (no config.yaml)")
    summary_path = path / "summary.json"
    old = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    algo_name = old.get("algorithm") or path.name.rsplit("-", 2)[0]
    cls = algorithm_class(algo_name)
    cfg = cfglib.from_dict(cls.Config, cfglib.load_yaml(path / "config.yaml"))
    report = cls.report(cfg, RunContext(path), read_metrics(path / "metrics.jsonl"))
    # What only the live run knew (its faults and wall time) stays as the run wrote it.
    keep = {k: old[k] for k in ("faults", "wall_s", "run_dir") if k in old}
    out = write_report(path, algo_name, cfglib.to_dict(cfg), {**report.summary, **keep}, report.sections)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
