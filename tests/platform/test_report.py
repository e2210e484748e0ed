"""The run report: the algorithm's result first, then plots, then every metric; summary.json."""

from __future__ import annotations

import json

from troupe.platform.metrics import MetricsLog
from troupe.platform.report import first_values, last_values, write_report


def _history(run_dir):
    log = MetricsLog(run_dir)
    for step in range(3):
        log.write(step, {"reward/mean": 0.1 * step, "loss/policy": 1.0 - step})
    log.write(3, {"eval/accuracy": 0.5})
    log.close()


def test_report_reads_top_down_result_then_plots_then_metrics_then_config(tmp_path):
    _history(tmp_path)
    path = write_report(tmp_path, "algo", {"run": {"steps": 3}}, {"faults": 1}, ["## Algo result\n\nit worked"])
    text = path.read_text()
    order = [text.index(h) for h in ("## Algo result", "## Plots", "## Metrics: first and last", "## Config")]
    assert order == sorted(order)
    assert "Steps logged: 3. Faults: 1." in text
    assert "![reward](plots/reward.png)" in text and (tmp_path / "plots" / "reward.png").is_file()
    assert "| reward/mean | 0 | 0.2 |" in text


def test_a_plot_a_section_shows_is_not_repeated(tmp_path):
    _history(tmp_path)
    text = write_report(tmp_path, "algo", {}, {}, ["## Result\n\n![reward](plots/reward.png)"]).read_text()
    assert text.count("plots/reward.png") == 1


def test_summary_holds_the_algorithm_figures_and_first_and_last_metrics(tmp_path):
    _history(tmp_path)
    write_report(tmp_path, "algo", {}, {"headline": 0.9}, [])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["algorithm"] == "algo" and summary["steps"] == 3 and summary["headline"] == 0.9
    assert summary["first"]["loss/policy"] == 1.0 and summary["final"]["loss/policy"] == -1.0


def test_first_and_last_values_skip_booleans_and_keep_each_key_once():
    history = [{"step": 0, "a": 1.0, "flag": True}, {"step": 1, "a": 2.0, "b": 3}]
    assert first_values(history) == {"a": 1.0, "b": 3}
    assert last_values(history) == {"a": 2.0, "b": 3}


def test_markdown_table_lines():
    from troupe.platform.report import markdown_table

    assert markdown_table(["policy", "a", "b"], [["SFT", "0.1", "–"], ("bpo", "1", "2")]) == [
        "| policy | a | b |", "|---|---|---|", "| SFT | 0.1 | – |", "| bpo | 1 | 2 |"]
