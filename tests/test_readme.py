"""The README's Python example runs verbatim."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def api_example() -> str:
    text = README.read_text()
    m = re.search(r"<!-- api-example[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert m, "README lost its api-example block"
    return m.group(1)


@pytest.mark.timeout(600)
def test_readme_api_example_runs(ray_local, troupe_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the run directory lands under ./runs
    exec(compile(api_example(), str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "step 1: reward" in out and "eval/accuracy" in out
    assert list((tmp_path / "runs").glob("grpo-*/report.md"))
