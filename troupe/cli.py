"""The `troupe` command: run, list, report, export, fetch (and submit, for clusters)."""

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
    r.add_argument("--out", default=None, help="the run directory, a path or a storage URI such as "
                   "s3://bucket/runs/NAME (default: run.out/<algo>-<time>)")
    r.add_argument("--resume", default=None, metavar="RUN_DIR",
                   help="continue a run (a path or a URI) from its last checkpoint")
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

    f = sub.add_parser("fetch", help="copy a run directory from storage or a cluster job to a local folder",
                       description="troupe fetch SRC DEST  |  troupe fetch --job ID [--address URL] DEST")
    f.add_argument("src", nargs="?", default=None, help="the run directory: a URI (s3://..., file://...) or a path")
    f.add_argument("dest", nargs="?", default=None, help="the local folder to write")
    f.add_argument("--job", default=None, metavar="ID", help="the run of this job (`troupe submit`): its run "
                   "directory is read from the job's log")
    f.add_argument("--address", default=None, help="with --job: the job API (default: $RAY_API_SERVER_ADDRESS)")
    f.add_argument("--checkpoints", choices=("all", "latest", "none"), default="all",
                   help="which checkpoints to copy (default: all)")
    f.add_argument("--force", action="store_true", help="write into DEST when it exists and is not empty")

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
        if args.command == "fetch":
            return _fetch(args)
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
    from troupe.platform.storage import join

    if args.print_config:
        cfg = driver.resolve_config(args.algorithm, args.preset, args.overrides)
        print(json.dumps(cfglib.to_dict(cfg), indent=2))
        return 0
    if args.resume and args.preset:
        raise TroupeError("--resume takes the config saved in the run directory; drop --preset")
    summary = driver.run(args.algorithm, args.preset, args.overrides, out=args.out, resume=args.resume)
    # `troupe submit --follow` and `troupe fetch --job` read this line from a job's log.
    print(f"\nrun directory: {summary['run_dir']}\nreport: {join(summary['run_dir'], 'report.md')}")
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
    import tempfile

    from troupe.algorithms.export import export
    from troupe.platform.storage import RemoteRunDir, is_uri

    with tempfile.TemporaryDirectory(prefix="troupe-export-") as tmp:
        run_dir = args.run_dir
        if is_uri(run_dir):  # read the checkpoint it needs from storage first
            run_dir = RemoteRunDir(run_dir).pull(tmp, checkpoints="latest" if args.step is None else "all")
        info = export(run_dir, args.out, step=args.step, arm=args.arm, merge_lora=args.merge_lora,
                      force=args.force)
    arm = f" ({info['arm']})" if info["arm"] else ""
    what = "PEFT adapter" if info["kind"] == "adapter" else f"{info['dtype']} model"
    print(f"exported the {what} of step {info['step']}{arm} to {info['out']}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from troupe.platform.storage import fetch

    src, dest = args.src, args.dest
    if args.job:
        if dest is None and src is not None:
            src, dest = None, src  # `troupe fetch --job ID DEST`
        if src is not None:
            raise TroupeError("troupe fetch: give either SRC or --job ID, not both")
        src = _job_run_dir(args.job, args.address)
    if src is None or dest is None:
        raise TroupeError("troupe fetch: give the run directory and a local folder: troupe fetch SRC DEST "
                          "(or troupe fetch --job ID DEST)")
    out = fetch(src, dest, checkpoints=args.checkpoints, force=args.force)
    print(f"fetched {src} to {out}")
    return 0


def _job_run_dir(job_id: str, address: str | None) -> str:
    """The run directory a `troupe run` job printed, when the client can reach it."""
    from troupe.cluster.submit import connect, job_logs, run_dir_from_logs
    from troupe.platform.storage import is_uri

    where = run_dir_from_logs(job_logs(connect(address), job_id))
    if where is None:
        raise TroupeError(f"job {job_id} has not printed a run directory (it is still running, or it failed "
                          f"before its run finished): see `troupe submit --follow-job {job_id}`")
    if not is_uri(where) and not Path(where, "config.yaml").is_file():
        raise TroupeError(
            f"job {job_id} wrote its run to {where} on the cluster, which this machine cannot read. Submit runs "
            "with run.out set to storage both can reach (a URI such as s3://bucket/runs or a shared mount), "
            "then fetch them from there")
    return where


def _report(run_dir: str) -> int:
    from troupe.platform.storage import RemoteRunDir, is_uri

    if not is_uri(run_dir):
        return _report_local(run_dir)
    import tempfile

    remote = RemoteRunDir(run_dir)
    with tempfile.TemporaryDirectory(prefix="troupe-report-") as tmp:
        local = remote.pull(Path(tmp) / remote.uri.rsplit("/", 1)[-1], checkpoints="none")  # keeps its name
        rc = _report_local(str(local))
        remote.push(local)  # the rebuilt report, plots and summary go back beside the run
    return rc


def _report_local(run_dir: str) -> int:
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
