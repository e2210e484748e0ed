"""The in-process GPU check (benchmarks/gpu.py) at tiny size on CPU, as it runs on a GPU node:
from a copy of the repository, troupe not installed (no entry points), and ``import ray`` or
``import vllm`` failing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BARE_NODE = textwrap.dedent("""
    import importlib.abc, importlib.metadata as md, runpy, sys

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("ray", "vllm"):
                raise ImportError(f"No module named {name!r} (not installed on this node)")

    sys.meta_path.insert(0, Missing())
    # troupe is not installed there: none of its entry points exist.
    _entry_points = md.entry_points
    md.entry_points = lambda **kw: [] if str(kw.get("group", "")).startswith("troupe.") else _entry_points(**kw)
    sys.argv = ["benchmarks/gpu.py", *sys.argv[1:]]
    try:
        runpy.run_path("benchmarks/gpu.py", run_name="__main__")
    finally:
        print("troupe from", sys.modules["troupe"].__file__ if "troupe" in sys.modules else None)
""")


def copy_of_the_repository(dest: Path) -> int:
    """What a copy for the GPU node needs (troupe/ and benchmarks/gpu.py); returns its bytes."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "troupe", dest / "troupe", ignore=ignore)
    (dest / "benchmarks").mkdir()
    shutil.copy2(ROOT / "benchmarks" / "gpu.py", dest / "benchmarks" / "gpu.py")
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


@pytest.mark.timeout(120)
def test_the_gpu_check_runs_on_cpu_from_a_copy_without_ray_vllm_or_an_install(tmp_path):
    repo = tmp_path / "repo"
    size = copy_of_the_repository(repo)
    assert size < 64 * 2**20  # what the GPU machine's copy allows
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", BARE_NODE, "--device", "cpu", "--out", str(out)], cwd=repo,
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"troupe from {repo / 'troupe' / '__init__.py'}" in proc.stdout  # the copy, not the installed one
    result = json.loads((out / "gpu.json").read_text())
    assert result["device"] == "cpu" and result["dtype"] == "bfloat16"
    claims = result["claims"]
    assert len(claims) >= 10 and all(c["holds"] for c in claims), [c for c in claims if not c["holds"]]
    assert all(set(c) == {"claim", "measured", "holds"} for c in claims)
    texts = " ".join(c["claim"] for c in claims)
    for part in ("recomputed log-probs", "scorer", "GRPO update", "LoRA adapter", "distillation steps", "VL model",
                 "tokens/s",
                 "learner step", "without importing Ray"):
        assert part in texts, part


def test_a_failing_section_is_a_claim_that_does_not_hold(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    check = gpu.Check()
    check.section("broken", lambda: 1 / 0)
    assert check.claims == [{"claim": "broken runs to the end", "measured": "ZeroDivisionError: division by zero",
                             "holds": False}]
    monkeypatch.setattr(gpu, "lm_checks", lambda *a: (_ for _ in ()).throw(RuntimeError("no kernel")))
    monkeypatch.setattr(gpu, "vl_checks", lambda *a: None)
    monkeypatch.setattr(gpu, "scale_checks", lambda *a: None)
    assert gpu.main(["--device", "cpu", "--out", str(tmp_path)]) == 1
    written = json.loads((tmp_path / "gpu.json").read_text())["claims"]
    assert {"claim": "tiny LM runs to the end", "measured": "RuntimeError: no kernel", "holds": False} in written
    # Where it broke travels with the result: a GPU run is too scarce to repeat for a traceback.
    trace = json.loads((tmp_path / "gpu.json").read_text())["tracebacks"]["tiny LM"]
    assert trace[-1] == "RuntimeError: no kernel"


# -- scripts/gpu_check.sh ----------------------------------------------------------------------------
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_the_gpu_check_script_parses_and_every_preset_it_runs_exists():
    import re

    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    runs = re.findall(r"troupe\" run (\w+) --preset ([\w-]+)", SCRIPT.read_text())
    assert {alg for alg, _ in runs} >= {"grpo", "bpo", "opd", "icrm"}
    for alg, preset in runs:
        assert (ROOT / "troupe" / "algorithms" / alg / "presets" / f"{preset}.yaml").is_file(), (alg, preset)


def icrm_step(out: Path) -> tuple[str, list[str]]:
    """The ICRM step of the script: its data snippet and the overrides of its run, ``$out`` → ``out``."""
    import re
    import shlex

    text = SCRIPT.read_text()
    snippet = re.search(r"step tiny-icrm-data \"\$venv/bin/python\" -c '\n(.*?)\n' \"\$out/tiny-icrm\"", text, re.S)
    command = re.search(r"step icrm-gpu \"\$venv/bin/troupe\" run icrm --preset gpu --out \"\$out/icrm-gpu\" \\\n"
                        r"((?:.*\\\n)*.*)\n", text)
    assert snippet and command
    overrides = shlex.split(command.group(1).replace("\\\n", " ").replace("$out", str(out)))
    return snippet.group(1), overrides


@pytest.mark.timeout(120)
def test_the_icrm_step_writes_its_backbone_and_data_and_its_overrides_resolve_with_the_gpu_preset(tmp_path,
                                                                                                   monkeypatch):
    """What the ICRM step runs on a GPU node, short of the run: the snippet writes a tiny Qwen2
    backbone and a HelpSteer2-format file, and the gpu preset with the step's overrides reads them
    into held-out evaluation splits (the run itself on CPU: tests/algorithms/icrm/test_icrm_sources.py)."""
    import datasets

    from troupe.algorithms.icrm.algorithm import ICRMAlgorithm
    from troupe.algorithms.icrm.config import ICRMRunConfig
    from troupe.algorithms.icrm.learner import eval_sets, task_data
    from troupe.platform.config import resolve

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))
    snippet, overrides = icrm_step(tmp_path)
    (tmp_path / "tiny-icrm").mkdir()
    proc = subprocess.run([sys.executable, "-c", snippet, str(tmp_path / "tiny-icrm")], cwd=ROOT,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "tiny-icrm/backbone/config.json").read_text())["model_type"] == "qwen2"
    cfg = resolve(ICRMRunConfig, ICRMAlgorithm.presets_dir(), "gpu", overrides)
    assert cfg.backbone.path == str(tmp_path / "tiny-icrm/backbone") and cfg.backbone.device == "cuda"
    assert cfg.workers.num_gpus > 0 and cfg.data.source == "helpsteer2" and cfg.rl.steps == 0
    sets = eval_sets(cfg, task_data(cfg))
    assert all(len(sets[s][k][0]) == cfg.data.eval_episodes for s in sets for k in cfg.data.eval_ks)
