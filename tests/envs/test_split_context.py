"""The split-context task of §D: its generative rates, the raw slice's budget, the reference
contents and their checkers, §D.1's stage labels, the ideal executor against the simulator's
structure, the SFT rows, seeding and bad input."""

import dataclasses
import itertools
import math
import subprocess
import sys

import numpy as np
import pytest

from troupe.envs.split_context import (
    KINDS,
    SLOTS,
    STAGES,
    SplitContext,
    SplitContextConfig,
    SplitContextSFT,
    cryptic_message,
    decode_cryptic,
    externalised,
    first_failing_stage,
    ideal_executor,
    misleading,
    parse_action,
    parse_facts,
    parse_restated_key,
    plain_message,
    truncate,
)


def steps_of(config: SplitContextConfig, n: int, seed: int = 0):
    return SplitContext(config).steps(n, np.random.default_rng(seed))


def within_binomial(rate: float, q: float, n: int) -> bool:
    return abs(rate - q) <= 4 * math.sqrt(q * (1 - q) / n) + 1e-12  # 4 sigma: a flaky test is rarer than 1e-4


def success_rate(steps, kind: str, seed: int = 0, decodes_cryptic: bool = True) -> float:
    rng = np.random.default_rng(seed)
    return float(np.mean([ideal_executor(s, s.received(kind), rng, decodes_cryptic)[1] == s.action for s in steps]))


# -- the generative rates ----------------------------------------------------------------------------
@pytest.mark.parametrize("config", [SplitContextConfig.weak_local(), SplitContextConfig.strong_local(),
                                    SplitContextConfig(q_L=0.3, q_M=0.2, K=3, local_miss="stale")])
def test_local_view_and_main_belief_rates_match_q_L_and_q_M(config):
    steps = steps_of(config, 4000)
    n = len(steps)
    assert within_binomial(np.mean([s.local_has_key for s in steps]), config.q_L, n)
    assert within_binomial(np.mean([s.m_right for s in steps]), config.q_M, n)


def test_a_step_is_consistent_with_its_parameters():
    for s in steps_of(SplitContextConfig(K=5, step_types=("copy", "next"), local_miss="stale"), 500):
        doc = dict(s.document)
        assert len(s.document) == len(doc) == 8 and set(doc) <= set(SLOTS) and s.key in doc
        assert all(1 <= v <= 5 for v in doc.values()) and 1 <= s.value <= 5
        assert len(s.local) == 2
        local = dict(s.local)
        if s.local_has_key:
            assert local[s.key] == s.value
        else:  # stale: the key with a wrong value
            assert s.key in local and local[s.key] != s.value
        # every fact but the key is the truth on both sides
        assert all(doc[k] == v for k, v in s.local if k != s.key)
        want = s.value if s.step_type == "copy" else s.value % 5 + 1
        assert s.action == str(want)
    for s in steps_of(SplitContextConfig(), 300):  # distractors: no fact about the key at all
        assert s.local_has_key or s.key not in dict(s.local)


def test_episodes_keep_their_slots_and_have_the_configured_steps():
    ep = SplitContext(steps=5, doc_facts=6, local_facts=3, raw_length=4).episode(np.random.default_rng(3))
    assert len(ep.steps) == 5 and [s.index for s in ep.steps] == list(range(5))
    assert all(set(dict(s.document)) == set(ep.slots) for s in ep.steps)


def test_per_episode_parameters_override_the_config():
    task, rng = SplitContext(steps=8), np.random.default_rng(0)
    eps = [task.episode(rng, q_L=1.0, q_M=0.0) for _ in range(20)]
    assert all(s.local_has_key and not s.m_right for e in eps for s in e.steps)


# -- the raw slice against the budget -------------------------------------------------------------------
@pytest.mark.parametrize("position", ["uniform", "first", "last"])
def test_a_raw_slice_longer_than_the_budget_loses_the_key_exactly_when_it_lies_past_the_budget(position):
    config = SplitContextConfig(raw_length=6, budget=3, q_M=1.0, raw_key_position=position)
    lost = []
    for s in steps_of(config, 600):
        sent, read = s.content("raw"), s.received("raw")
        assert sent == " ".join(f"{k}={v}" for k, v in s.document[s.raw_start:s.raw_start + 6])  # verbatim
        assert f" {sent} " in f" {' '.join(f'{k}={v}' for k, v in s.document)} "
        assert s.raw_slice[s.raw_key_pos][0] == s.key
        assert parse_facts(read) == list(s.raw_slice[:3])
        assert externalised(sent, s)
        assert externalised(read, s) == (s.raw_key_pos < 3)
        lost.append(s.raw_key_pos >= 3)
    want = {"uniform": 0.5, "first": 0.0, "last": 1.0}[position]
    assert within_binomial(np.mean(lost), want, len(lost))


def test_a_raw_slice_within_the_budget_is_read_whole():
    for s in steps_of(SplitContextConfig.weak_local(raw="short"), 300):
        assert s.received("raw") == s.content("raw") and len(s.raw_slice) == 2
        assert externalised(s.received("raw"), s) == s.m_right


def test_truncation_keeps_the_first_facts_and_messages_whole():
    assert truncate("door=1 lamp=2 gate=3", 2) == "door=1 lamp=2"
    assert truncate("door=1 lamp=2", 5) == "door=1 lamp=2"
    assert truncate("key door is 3", 1) == "key door is 3"
    assert truncate("a3", 1) == "a3"


# -- reference contents and their checkers -----------------------------------------------------------------
def test_reference_messages_are_externalised_iff_main_belief_is_right_and_cryptic_decodes_back():
    steps = steps_of(SplitContextConfig(q_M=0.5), 600)
    assert {s.m_right for s in steps} == {True, False}
    for s in steps:
        plain, cryptic = s.content("plain"), s.content("cryptic")
        assert externalised(plain, s) == externalised(cryptic, s) == s.m_right
        assert misleading(plain, s) == misleading(cryptic, s) == (not s.m_right)
        assert len(cryptic) == 2 and decode_cryptic(cryptic) == (s.key, s.m_belief)
        assert parse_facts(plain) == [(s.key, s.m_belief)]
        assert not externalised(s.content("none"), s) and not misleading(s.content("none"), s)


def test_the_cryptic_code_is_the_slot_index_then_the_value():
    assert cryptic_message(("door", 3)) == "a3" and cryptic_message(("fan", 8)) == "l8"
    assert [decode_cryptic(cryptic_message((name, 5))) for name in SLOTS] == [(name, 5) for name in SLOTS]
    assert plain_message(("door", 3)) == "key door is 3"
    assert decode_cryptic("door=3") is None and decode_cryptic("") is None


def test_parsers():
    assert parse_facts("Key DOOR is 3, lamp = 5 and b2") == [("door", 3), ("lamp", 5), ("lamp", 2)]
    assert parse_facts("b2", cryptic=False) == [] and parse_facts("moon=3") == []
    assert parse_action("3") == "3" and parse_action(" act 7\n") == "7" and parse_action("12 7") == "7"
    assert parse_action("none") is None and parse_action("") is None
    assert parse_restated_key("door=3") == ("door", 3) and parse_restated_key(" Door = 3 ") == ("door", 3)
    assert parse_restated_key("door=?") is None and parse_restated_key("a3") is None


# -- §D.1's stages ----------------------------------------------------------------------------------------
def test_first_failing_stage_is_exclusive_and_exhaustive_on_a_grid():
    s = steps_of(SplitContextConfig(K=4, step_types=("next",)), 1)[0]
    wrong_value = s.value % 4 + 1
    wrong_action = next(a for a in "1234" if a != s.action)
    contents = {"none": "", "right": plain_message(s.key_fact), "right code": cryptic_message(s.key_fact),
                "wrong": plain_message((s.key, wrong_value)), "raw": "door=1 " + f"{s.key}={s.value}"}
    restated = {"right": f"{s.key}={s.value}", "wrong": f"{s.key}={wrong_value}", "unknown": f"{s.key}=?", "": ""}
    actions = {"right": s.action, "wrong": wrong_action, "garbage": "no idea"}
    seen = set()
    for (cn, c), (rn, r), (an, a) in itertools.product(contents.items(), restated.items(), actions.items()):
        stage = first_failing_stage(s, c, r, a)
        flags = {"externalisation": an != "right" and rn != "right" and cn in ("none", "wrong"),
                 "absorption": an != "right" and rn != "right" and cn in ("right", "right code", "raw"),
                 "closure": an != "right" and rn == "right"}
        assert sum(flags.values()) == (an != "right")  # one stage per failure, none on success
        assert stage == next((k for k, v in flags.items() if v), None)
        seen.add(stage)
    assert seen == {*STAGES, None}


def test_stages_of_the_ideal_executor_follow_the_content():
    for s in steps_of(SplitContextConfig(q_L=0.0, q_M=0.5, K=2), 400):
        for kind in KINDS:
            restated, action = ideal_executor(s, s.received(kind), np.random.default_rng(0))
            stage = first_failing_stage(s, s.content(kind), restated, action)
            if kind == "none" or (kind in ("plain", "cryptic") and not s.m_right):
                assert stage in (None, "externalisation")  # a lucky guess succeeds
            elif kind in ("plain", "cryptic"):
                assert stage is None
            elif not s.m_right:
                assert stage in (None, "externalisation")
            else:  # the raw slice held the key: lost past the budget, an absorption failure
                assert stage in ((None, "absorption") if s.raw_key_pos >= s.budget else (None,))


# -- the ideal executor against the simulator's structure -----------------------------------------------
def test_a_plain_message_fixes_a_missing_local_view_when_main_is_right():
    steps = [s for s in steps_of(SplitContextConfig(q_L=0.3, q_M=0.7, step_types=("copy", "next")), 800)
             if not s.local_has_key]
    right = [s for s in steps if s.m_right]
    assert right and success_rate(right, "plain") == 1.0
    assert success_rate(right, "none") < 0.3  # a uniform guess over 8
    assert success_rate([s for s in steps if not s.m_right], "plain") == 0.0  # misled


def test_none_and_plain_match_the_simulator_closed_forms_for_an_ideal_executor():
    from troupe.algorithms.comm.simulator import CommParams, p_msg, p_none

    for name in ("weak_local", "strong_local"):
        config = getattr(SplitContextConfig, name)()
        steps = steps_of(config, 3000, seed=1)
        # the ideal executor: always closes, always absorbs, trusts the message on conflict
        p = getattr(CommParams, name)(p_c=1.0, e=1.0, a_plain=1.0, w=1.0)
        assert within_binomial(success_rate(steps, "none"), float(p_none(p)), len(steps))
        assert within_binomial(success_rate(steps, "plain"), float(p_msg(p, 1.0)), len(steps))


def test_the_ideal_executor_reproduces_the_simulator_structure():
    rates = {}
    for name, raw in itertools.product(("weak_local", "strong_local"), ("long", "short")):
        steps = steps_of(getattr(SplitContextConfig, name)(raw=raw), 1000, seed=2)
        rates[name, raw] = {k: success_rate(steps, k) for k in KINDS}
        rates[name, raw]["bounded cryptic"] = success_rate(steps, "cryptic", decodes_cryptic=False)
        # Bayes-sufficient: an ideal decoder acts on the cryptic code exactly as on the plain message
        rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
        assert all(ideal_executor(s, s.received("cryptic"), rng_a) == ideal_executor(s, s.received("plain"), rng_b)
                   for s in steps)
    weak, strong = rates["weak_local", "long"], rates["strong_local", "long"]
    assert weak["plain"] > weak["raw"] + 0.1  # claim 1: the message beats a raw slice past the budget
    assert weak["plain"] > weak["none"] + 0.2 and strong["plain"] < strong["none"] - 0.2  # claim 4's signs
    for r in rates.values():
        assert r["bounded cryptic"] == pytest.approx(r["none"], abs=0.03)  # an unread code is no content
    assert rates["weak_local", "short"]["raw"] == pytest.approx(rates["weak_local", "short"]["plain"], abs=0.03)
    assert rates["weak_local", "short"]["raw"] > weak["raw"] + 0.1  # raw works when it fits the budget

    def best(name, q_M):  # claim 3: a stronger M helps only when the local view is weak
        steps = steps_of(getattr(SplitContextConfig, name)(q_M=q_M), 1000, seed=3)
        return max(success_rate(steps, k) for k in KINDS)

    gain_weak = best("weak_local", 0.95) - best("weak_local", 0.55)
    gain_strong = best("strong_local", 0.95) - best("strong_local", 0.55)
    assert gain_weak > 0.15 and gain_strong < 0.08 and gain_weak > 3 * gain_strong


# -- prompts and SFT rows ----------------------------------------------------------------------------------
def test_prompts_show_each_agent_only_its_own_view():
    task = SplitContext()
    s = steps_of(SplitContextConfig(), 1, seed=4)[0]
    doc = " ".join(f"{k}={v}" for k, v in s.document)
    local = " ".join(f"{k}={v}" for k, v in s.local)
    assert task.main_prompt(s, "plain") == f"note: {s.key}={s.m_belief}\nsend {s.key} plain:"
    whole = SplitContext(SplitContextConfig(main_view="document"))
    assert whole.main_prompt(s, "plain") == f"doc: {doc}\nsend {s.key} plain:"
    assert whole.main_prompt(s, "cryptic") == f"doc: {doc}\nsend {s.key} code:"
    assert task.executor_prompt(s, "") == f"about {s.key}\nview: {local}\nmsg: -\nact on {s.key}:"
    assert task.probe_prompt(s, "a3") == f"about {s.key}\nview: {local}\nmsg: a3\nrestate {s.key}:"
    nxt = dataclasses.replace(s, step_type="next")
    assert task.executor_prompt(nxt, "a3").endswith(f"act after {s.key}:")
    with pytest.raises(ValueError, match="not written by M"):
        task.main_prompt(s, "raw")


def test_sft_rows_parse_back_to_the_right_answers():
    task = SplitContext(SplitContextConfig(q_L=0.5, q_M=0.7, step_types=("copy", "next"), local_miss="stale"))
    main = task.sft_rows("main", 400, np.random.default_rng(0))
    assert {r["kind"] for r in main} == {"plain", "cryptic"}
    for r in main:
        doc = dict(parse_facts(r["prompt"].split("\n")[0], cryptic=False))
        got = parse_facts(r["answer"]) if r["kind"] == "plain" else [decode_cryptic(r["answer"])]
        assert got == [(r["key"], doc[r["key"]])]  # M's belief, as its document holds it
    executor = task.sft_rows("executor", 1500, np.random.default_rng(1))
    assert {(r["kind"], r["question"]) for r in executor} == {(k, q) for k in KINDS for q in ("act", "restate")}
    informed = 0
    for r in executor:
        _, view, msg, _ = r["prompt"].split("\n")
        said = [v for k, v in parse_facts(msg[len("msg: "):]) if k == r["key"]]
        seen = [v for k, v in parse_facts(view, cryptic=False) if k == r["key"]]
        belief = (said or seen or [None])[0]
        if r["question"] == "restate":
            assert parse_restated_key(r["answer"]) == (None if belief is None else (r["key"], belief))
        elif belief is not None:
            shift = 0 if "act on" in r["prompt"] else 1
            assert parse_action(r["answer"]) == str((belief - 1 + shift) % 8 + 1)
            informed += belief == r["value"]
            assert (parse_action(r["answer"]) == r["action"]) == (belief == r["value"])
        else:
            assert parse_action(r["answer"]) in set("12345678")  # a guess
    assert informed > 200


def test_sft_rows_fit_through_the_sft_path_with_short_prompts():
    pytest.importorskip("torch")
    from troupe.actors.models import train_tokenizer
    from troupe.algorithms.sft import sft_tensors

    for role in ("main", "executor"):
        sft = SplitContextSFT(SplitContext(), role)
        tok = train_tokenizer(sft.corpus(600), 384)
        rows = sft.sample(16, "train", np.random.default_rng(0))
        ids, attn, labels = sft_tensors(tok, rows)
        for row, lab in zip(rows, labels, strict=True):
            answer = tok.decode([int(t) for t in lab if t != -100], skip_special_tokens=True)
            assert answer == row["answer"]  # the loss is on the completion only
            assert len(tok(row["prompt"])["input_ids"]) <= 48  # tens of tokens
    with pytest.raises(ValueError, match="'train'"):
        SplitContextSFT(SplitContext(), "main").sample(1, "test", np.random.default_rng(0))


# -- seeding, imports and bad input -------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_episodes_and_rows():
    task = SplitContext(SplitContextConfig(step_types=("copy", "next")))
    assert task.episodes(5, np.random.default_rng(9)) == task.episodes(5, np.random.default_rng(9))
    assert task.episodes(5, np.random.default_rng(9)) != task.episodes(5, np.random.default_rng(10))
    assert (task.sft_rows("executor", 50, np.random.default_rng(2))
            == task.sft_rows("executor", 50, np.random.default_rng(2)))
    sft = SplitContextSFT(task, "main")
    assert sft.corpus(30, seed=1) == sft.corpus(30, seed=1)


def test_generating_needs_neither_ray_nor_torch():
    code = ("import sys; sys.modules.update(torch=None, ray=None, transformers=None)\n"
            "import numpy as np\nfrom troupe.envs.split_context import SplitContext\n"
            "SplitContext().sft_rows('executor', 4, np.random.default_rng(0))")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"K": 1}, "task.K"), ({"K": 9}, "task.K"), ({"q_L": 1.5}, "task.q_L"), ({"q_M": -0.1}, "task.q_M"),
    ({"steps": 0}, "task.steps"), ({"steps": 9}, "task.steps"), ({"budget": 0}, "task.budget"),
    ({"budget": -2}, "task.budget"), ({"raw_length": 9}, "task.raw_length"), ({"doc_facts": 13}, "task.doc_facts"),
    ({"local_facts": 8}, "task.local_facts"), ({"step_types": ("jump",)}, "task.step_types"),
    ({"step_types": ()}, "task.step_types"), ({"local_miss": "gone"}, "task.local_miss"),
    ({"raw_key_position": "middle"}, "task.raw_key_position"),
])
def test_bad_config_is_one_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        SplitContextConfig(**overrides)


def test_bad_arguments_are_value_errors():
    s = steps_of(SplitContextConfig(), 1)[0]
    with pytest.raises(ValueError, match="kind 'summary'"):
        s.content("summary")
    with pytest.raises(ValueError, match="kind 'summary'"):
        SplitContext().sft_rows("executor", 2, np.random.default_rng(0), kinds=("summary",))
    with pytest.raises(ValueError, match="role"):
        SplitContextSFT(SplitContext(), "critic")
    with pytest.raises(ValueError, match="task.raw"):
        SplitContextConfig.weak_local(raw="medium")
    with pytest.raises(ValueError, match="task.q_L"):
        SplitContext().episode(np.random.default_rng(0), q_L=2.0)
    jump = dataclasses.replace(s, step_type="jump")
    with pytest.raises(ValueError, match="step type 'jump'"):
        SplitContext().executor_prompt(jump, "")
    with pytest.raises(ValueError, match="step type 'jump'"):
        _ = jump.action
