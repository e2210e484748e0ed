"""§G.6's synthetic judgment stream and the SummEval annotation loader."""

import json

import numpy as np
import pytest

from troupe.algorithms.judge import model as M
from troupe.envs import judge_streams as JS
from troupe.envs.judge_streams import SyntheticConfig, synthetic_stream
from troupe.platform.errors import ConfigError, DataError


def test_confusion_rows_follow_diag_and_tie():
    th = JS.confusion(0.65, 0.2)
    assert np.allclose(th, [[0.65, 0.15, 0.2], [0.15, 0.65, 0.2], [0.175, 0.175, 0.65]])
    with pytest.raises(ConfigError, match="diag"):
        JS.confusion(0.9, 0.2)


@pytest.mark.parametrize("beta", [0.0, 0.15, 0.4])
def test_judge_pair_model_has_exactly_the_requested_order_bias(beta):
    phi = JS.judge_phi(0.8, beta)
    assert np.allclose(phi.sum(-1), 1)
    assert np.allclose(M.beta_ord(phi[None]), beta)
    if beta == 0:  # each order alone is right with the stated accuracy
        assert np.allclose(phi.reshape(3, 3, 3).sum(-1)[np.arange(3), np.arange(3)], 0.8)


def test_stream_is_seeded_and_has_the_g6_shape():
    a, b = synthetic_stream(SyntheticConfig(n=50, seed=4)), synthetic_stream(SyntheticConfig(n=50, seed=4))
    assert a.comparisons == b.comparisons and np.array_equal(a.verdicts, b.verdicts)
    assert a.comparisons != synthetic_stream(SyntheticConfig(n=50, seed=5)).comparisons
    assert len(a.comparisons) == 50 and len(a.raters) == 33
    for c in a.comparisons:
        groups = [h.group for h in c.labels]
        assert groups.count("expert") == 3 and groups.count("crowd") == 3 and c.judge is not None
    assert a.theta.shape == (33, 3, 3) and np.allclose(a.theta[0], JS.confusion(0.85, 0.05))


def test_labels_and_judge_calls_follow_their_distributions():
    st = synthetic_stream(SyntheticConfig(n=6000, beta_ord=0.15, seed=0))
    assert np.bincount(st.verdicts, minlength=3) / 6000 == pytest.approx([0.4, 0.4, 0.2], abs=0.02)
    crowd = [(st.verdicts[i], "ABT".index(h.label)) for i, c in enumerate(st.comparisons)
             for h in c.labels if h.group == "crowd"]
    v, y = np.asarray(crowd).T
    for u in range(3):
        assert np.bincount(y[v == u], minlength=3) / (v == u).sum() == pytest.approx(st.theta[3, u], abs=0.02)
    cells = np.array([M.cell("ABT".index(c.judge.ab), "ABT".index(c.judge.ba)) for c in st.comparisons])
    beta_hat = (cells == M.FIRST_CONSISTENT).mean() - (cells == M.SECOND_CONSISTENT).mean()
    assert beta_hat == pytest.approx(0.15, abs=0.02)
    assert 0 < st.disagreement.mean() < 1 and st.disagreement.min() == 0


def test_null_condition_has_no_first_position_excess():
    st = synthetic_stream(SyntheticConfig(n=6000, beta_ord=0.0, seed=1))
    cells = np.array([M.cell("ABT".index(c.judge.ab), "ABT".index(c.judge.ba)) for c in st.comparisons])
    assert (cells == M.FIRST_CONSISTENT).mean() - (cells == M.SECOND_CONSISTENT).mean() == pytest.approx(0, abs=0.01)


def test_late_labels_arrive_after_their_comparison_and_encode():
    st = synthetic_stream(SyntheticConfig(n=40, late_fraction=0.3, seed=2))
    first = {}
    for k, c in enumerate(st.comparisons):
        first.setdefault(c.id, k)
        if c.judge is None:  # a late arrival carries only labels
            assert first[c.id] < k and len(c.labels) == 1
    s = M.encode_stream(st.comparisons)
    assert s.n_items == 40 and s.counts["late_events"] > 0
    assert sum(len(o) for o in s.by_item()) == 40 * 7


def test_bad_synthetic_config_raises():
    with pytest.raises(ConfigError, match="raters per item"):
        SyntheticConfig(experts_per_item=4)
    with pytest.raises(ConfigError, match="pi="):
        SyntheticConfig(pi=(0.5, 0.5, 0.5))


# -- SummEval ----------------------------------------------------------------------------------------
def scores(c, k, f, r):
    return {"coherence": c, "consistency": k, "fluency": f, "relevance": r}


def record(doc, system, text, experts, turkers):
    return {"id": doc, "model_id": system, "decoded": text, "references": ["ref"], "filepath": "x.story",
            "expert_annotations": experts, "turker_annotations": turkers}


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def summeval(tmp_path):
    e = [scores(5, 5, 5, 5), scores(4, 5, 5, 3), scores(3, 5, 4, 4)]
    t = [scores(4, 4, 4, 4)] * 5
    rows = [
        record("d1", "M0", "s0", e, t),
        record("d1", "M1", "s1", [scores(4, 5, 5, 4), scores(4, 4, 5, 3), scores(5, 5, 4, 4)], [scores(4, 3, 5, 4)] * 5),
        record("d1", "M2", "s2", e, t),
        record("d2", "M0", "u0", e, t),
        record("d2", "M1", "u1", e, [scores(5, 5, 5, 5)] * 5),
    ]
    return write(tmp_path / "model_annotations.aligned.jsonl", rows)


def test_summeval_ratings_become_pairwise_labels_with_ties(summeval):
    out = JS.load_summeval(summeval, pairs_per_document=None)
    assert out.counts == {"lines": 5, "duplicate_lines": 0, "pairs": (3 + 1) * 4}
    byid = {c.id: c for c in out.comparisons}
    c = byid["d1:coherence:M0|M1"]
    assert [(h.rater, h.group, h.label) for h in c.labels] == [
        ("expert0", "expert", "A"), ("expert1", "expert", "T"), ("expert2", "expert", "B"),
    ] + [(f"turker{k}", "turker", "T") for k in range(5)]
    assert c.responses == ("s0", "s1") and c.judge is None
    assert [h.label for h in byid["d1:consistency:M0|M1"].labels] == ["T", "A", "T"] + ["A"] * 5
    meta = out.meta[out.comparisons.index(c)]
    assert (meta.document, meta.dimension, meta.system_a, meta.system_b) == ("d1", "coherence", "M0", "M1")
    assert meta.disagreement == pytest.approx(1 - 6 / 8)
    s = M.encode_stream(out.comparisons)
    assert s.groups == ["expert", "turker"] and len(s.raters) == 8


def test_summeval_samples_pairs_per_document_and_dimensions(summeval):
    out = JS.load_summeval(summeval, dimensions=("fluency",), pairs_per_document=2, seed=1)
    docs = [m.document for m in out.meta]
    assert docs.count("d1") == 2 and docs.count("d2") == 1 and {m.dimension for m in out.meta} == {"fluency"}


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"id": "d", "decoded": "s"}, "lacks the field 'model_id'"),
        (record("d", "M", "s", [scores(1, 2, 3, "high")], []), "consistency|relevance"),
        (record("d", "M", "s", [{"coherence": 1}], []), "lacks the score"),
        ({"id": "d", "model_id": "M", "decoded": "s", "expert_annotations": []}, "turker_annotations"),
        ("{not json", "not JSON"),
    ],
)
def test_summeval_bad_lines_name_the_line_and_field(tmp_path, row, needle):
    path = write(tmp_path / "bad.jsonl", [record("d0", "M0", "s", [], []), row])
    with pytest.raises(DataError, match="line 2") as e:
        JS.load_summeval(path)
    assert any(n in str(e.value) for n in needle.split("|"))


def test_summeval_repeated_summary_ids(tmp_path):
    same = record("d", "M0", "s", [scores(1, 1, 1, 1)], [])
    out = JS.load_summeval(write(tmp_path / "dup.jsonl", [same, same, record("d", "M1", "t", [scores(2, 1, 1, 1)], [])]))
    assert out.counts["duplicate_lines"] == 1 and out.counts["pairs"] == 4
    clash = write(tmp_path / "clash.jsonl", [same, record("d", "M0", "other", [scores(1, 1, 1, 1)], [])])
    with pytest.raises(DataError, match="repeats with a different summary"):
        JS.load_summeval(clash)
    with pytest.raises(ConfigError, match="dimensions"):
        JS.load_summeval(clash, dimensions=("style",))
