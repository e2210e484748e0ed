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


ROOT = README.parent
DOCS = sorted([README, *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def prose(text: str) -> str:
    """The text outside code blocks and inline code, where a Markdown link is a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    body = prose(text)
    return LINK.findall(body) + REF_LINK.findall(body)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", path.read_text()), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_in_the_docs_points_to_an_existing_file(doc):
    broken = []
    for target in links(doc.read_text()):
        if EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{doc.relative_to(ROOT)} has broken links: {broken}"


def test_link_check_finds_links_and_skips_code():
    text = "see [a](docs/a.md) and ![p](x.png)\n`[no](code.md)`\n```\n[no](fence.md)\n```\n[r]: ref.md\n"
    assert links(text) == ["docs/a.md", "x.png", "ref.md"]
    assert slug("Coming from TRL or verl") == "coming-from-trl-or-verl"
    assert slug("`troupe` on a cluster") == "troupe-on-a-cluster"


def test_every_registered_algorithm_has_a_row_in_the_readme_and_a_page():
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="troupe.algorithms")}
    assert names, "no troupe.algorithms entry points: is troupe installed?"
    table = README.read_text().split("## Algorithms", 1)[1].split("\n## ", 1)[0]
    for name in sorted(names):
        assert f"| `{name}` |" in table, f"README's Algorithms table has no row for {name}"
        assert f"(docs/{name}.md)" in table, f"README's row for {name} does not link docs/{name}.md"
        assert (ROOT / "docs" / f"{name}.md").exists(), f"docs/{name}.md is missing"
