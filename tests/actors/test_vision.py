"""The vision path: the tiny Qwen2.5-VL-style model, processor-free video preprocessing, and the
rollout engine, learner and scorer on rows that carry pixel frames."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from troupe.actors.learner import Learner
from troupe.actors.logprobs import completion_forward
from troupe.actors.models import load_causal_lm, save_model, train_tokenizer
from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.sampling import SamplingConfig, chat_format
from troupe.actors.scorer import Scorer
from troupe.actors.vision import (
    VIDEO_PAD,
    VISION_TOKENS,
    TinyVLSpec,
    VideoLayout,
    build_tiny_vl,
    resized_shape,
    video_patches,
    video_prompts,
    vision_token_ids,
)
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError, DataError
from troupe.platform.placement import ActorGraph, Role

COLOURS = {"red": (220, 40, 40), "green": (40, 190, 60), "blue": (50, 90, 230)}
QUESTION = ("What colour is the square?\nA. red\nB. green\nC. blue\nD. Cannot be determined from the video\n"
            "Answer with the letter.")
LAYOUT = TinyVLSpec().layout()


class ColourTask:
    """The answer is in the pixels only: a square of one of three colours somewhere in 8 black frames."""

    def __init__(self, square: int = 28) -> None:
        self.square = square

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        rows = []
        for _ in range(n):
            k = int(rng.integers(len(COLOURS)))
            frames = np.zeros((8, 56, 56, 3), np.uint8)
            y, x = rng.integers(0, 57 - self.square, 2)
            frames[:, y : y + self.square, x : x + self.square] = list(COLOURS.values())[k]
            rows.append({"prompt": QUESTION, "answer": "ABC"[k], "frames": frames})
        return rows

    def corpus(self, n: int = 100, seed: int = 0) -> list[str]:
        return [f"{QUESTION} {c}" for c in "ABCD"] * 20


@pytest.fixture(scope="module")
def tiny_vl_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-vl")
    tok = train_tokenizer(ColourTask().corpus(), special_tokens=VISION_TOKENS)
    save_model(build_tiny_vl(TinyVLSpec(), tok, seed=0), tok, path)
    return str(path)


def video_batch(tok, rows, completion_len=3, layout=LAYOUT):
    """A Batch as the engine builds it, with a fixed completion (for forward-only checks)."""
    texts, video = video_prompts([r["prompt"] for r in rows], [r.get("frames") for r in rows], layout)
    enc = tok(chat_format(tok, texts), return_tensors="pt", padding=True, add_special_tokens=False)
    c = torch.full((len(rows), completion_len), tok.convert_tokens_to_ids("A"))
    return Batch({"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"], "completion_ids": c,
                  "completion_mask": torch.ones_like(c), **video})


# -- preprocessing ---------------------------------------------------------------------------------
def test_video_patches_follow_the_qwen25vl_conv_layout():
    frames = np.random.default_rng(0).integers(0, 256, (8, 56, 56, 3), dtype=np.uint8)
    x, grid = video_patches(frames, LAYOUT)
    assert grid == (4, 4, 4) and x.shape == (64, 3 * 2 * 14 * 14) and x.dtype == np.float32
    norm = (frames / 255.0 - np.array(LAYOUT.mean)) / np.array(LAYOUT.std)  # [F, H, W, C]
    # patch index = t·16 + (block row·2 + block col)·4 + (row in block·2 + col in block): merge blocks contiguous
    for t, br, bc, r, c in [(0, 0, 0, 0, 0), (1, 0, 1, 1, 0), (3, 1, 1, 1, 1), (2, 1, 0, 0, 1)]:
        i = t * 16 + (br * 2 + bc) * 4 + r * 2 + c
        row, col = (br * 2 + r) * 14, (bc * 2 + c) * 14
        expect = norm[2 * t : 2 * t + 2, row : row + 14, col : col + 14].transpose(3, 0, 1, 2)  # [C, tp, p, p]
        np.testing.assert_allclose(x[i].reshape(3, 2, 14, 14), expect, atol=1e-5)


def test_frames_are_resized_to_the_patch_grid_and_odd_frame_counts_repeat_the_last():
    assert resized_shape(56, 56, LAYOUT) == (56, 56)
    h, w = resized_shape(240, 320, LAYOUT)  # aspect kept, area within max_pixels, sides multiples of 28
    assert (h, w) == (28, 56)
    frames = np.random.default_rng(1).integers(0, 256, (7, 60, 80, 3), dtype=np.uint8)
    x, grid = video_patches(frames, LAYOUT)
    assert grid == (4, 2, 4)  # 7 frames → 8 by repeating the last; 60×80 → 28×56
    last_pair = x[-8:].reshape(8, 3, 2, 196)
    np.testing.assert_array_equal(last_pair[:, :, 0], last_pair[:, :, 1])
    with pytest.raises(DataError, match="uint8"):
        video_patches(frames.astype(np.float32), LAYOUT)


def test_prompt_gets_one_video_pad_token_per_merged_patch_and_rows_without_video_none(tiny_vl_dir):
    tok = load_causal_lm(tiny_vl_dir)[1]
    frames = np.zeros((8, 56, 56, 3), np.uint8)
    texts, video = video_prompts(["q one", "q two"], [frames, None], LAYOUT)
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    pad = tok.convert_tokens_to_ids(VIDEO_PAD)
    assert [s.count(pad) for s in ids] == [16, 0]  # 4 frame pairs × (4×4 patches / 2×2 merge)
    assert video["pixel_values_videos"].shape == (2, 64, 1176)
    assert video["video_grid_thw"].tolist() == [[4, 4, 4], [0, 0, 0]]
    assert not video["pixel_values_videos"][1].any()


# -- model -------------------------------------------------------------------------------------------
def test_tiny_vl_saves_loads_and_scores_the_same(tiny_vl_dir, tmp_path):
    model, tok = load_causal_lm(tiny_vl_dir)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert VideoLayout.of(model.config) == LAYOUT  # the layout travels in config.json
    assert model.config.video_token_id == tok.convert_tokens_to_ids(VIDEO_PAD)
    save_model(model, tok, tmp_path)
    again = load_causal_lm(str(tmp_path))[0]
    assert json.loads((tmp_path / "config.json").read_text())["troupe_video"]["patch_size"] == 14
    batch = video_batch(tok, ColourTask().sample(3, "test", np.random.default_rng(0)))
    with torch.no_grad():
        a, b = completion_forward(model.eval(), batch)["logprobs"], completion_forward(again.eval(), batch)["logprobs"]
    assert torch.equal(a, b)


def test_a_hub_format_checkpoint_takes_its_layout_from_the_preprocessor_files(tiny_vl_dir, tmp_path):
    """A Qwen2.5-VL checkpoint troupe did not build has no ``troupe_video`` in config.json:
    the frame size and normalisation come from its (video_)preprocessor_config.json, the
    patch sizes from its vision config, and the engine samples from pixel rows with it."""
    model, tok = load_causal_lm(tiny_vl_dir)
    save_model(model, tok, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["troupe_video"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    mean, std = [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 28 * 28, "max_pixels": 56 * 56,
         "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "image_mean": mean, "image_std": std}))
    engine = HFRolloutEngine(str(tmp_path))
    layout = engine.video_layout
    assert (layout.patch_size, layout.temporal_patch_size, layout.merge_size) == (14, 2, 2)
    assert (layout.min_pixels, layout.max_pixels, layout.mean, layout.std) == (28 * 28, 56 * 56, tuple(mean), tuple(std))
    # The video preprocessor's file wins over the image one (Qwen2.5-VL ships both).
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps({"size": {"shortest_edge": 784,
                                                                                  "longest_edge": 784}}))
    assert VideoLayout.of(engine.model.config, tmp_path).max_pixels == 784
    rows = ColourTask().sample(2, "test", np.random.default_rng(0))
    batch = engine.generate([r["prompt"] for r in rows], SamplingConfig(max_new_tokens=2), rows, seed=0)
    assert batch["video_grid_thw"].tolist() == [[4, 4, 4]] * 2


def test_video_batches_of_other_sizes_concat_and_score_as_their_parts(tiny_vl_dir):
    model, tok = load_causal_lm(tiny_vl_dir)
    model.eval()
    rng = np.random.default_rng(2)
    small = video_batch(tok, ColourTask().sample(2, "test", rng))
    rows = [{"prompt": "Short?", "frames": rng.integers(0, 256, (4, 112, 112, 3), dtype=np.uint8)},
            {"prompt": QUESTION + " Think.", "frames": None}]
    big = video_batch(tok, rows, completion_len=5, layout=dataclasses.replace(LAYOUT, max_pixels=112 * 112))
    both = Batch.concat([small, big])  # patches right-padded to the longer video, prompts left-padded
    assert both["pixel_values_videos"].shape[1] == 2 * 8 * 8 and both["video_grid_thw"].tolist()[2] == [2, 8, 8]
    with torch.no_grad():
        parts = [completion_forward(model, b)["logprobs"] for b in (small, big)]
        joint = completion_forward(model, both)["logprobs"]
        picked = completion_forward(model, both.select([3, 0]))["logprobs"]
    assert torch.allclose(joint[:2, :3], parts[0], atol=1e-5)
    assert torch.allclose(joint[2:], parts[1], atol=1e-5)
    assert torch.allclose(picked[1, :3], parts[0][0], atol=1e-5)


def test_a_batch_with_more_videos_than_tokens_per_row_generates_and_scores(tiny_vl_dir):
    """The model's default time step per video is drawn from an iterator as long as the
    sequence; troupe passes one per video, so a wide batch of short rows works (an eval batch
    of a few hundred probes is wider than its ~40-token rows)."""
    engine = HFRolloutEngine(tiny_vl_dir)
    rows = ColourTask().sample(96, "test", np.random.default_rng(4))
    batch = engine.generate([r["prompt"] for r in rows], SamplingConfig(temperature=1.0, max_new_tokens=2), rows,
                            seed=0, option_letters=["ABCD"] * len(rows))
    assert len(rows) > batch["prompt_ids"].shape[1]  # more videos than tokens per row
    assert torch.isfinite(batch["option_logprobs"]).all()
    m = batch["completion_mask"].bool()
    with torch.no_grad():
        lp = completion_forward(engine.model, batch)["logprobs"]
    assert torch.allclose(lp[m], batch["logprobs"][m], atol=1e-4)


def test_the_engine_never_samples_a_vision_placeholder(tiny_vl_dir):
    """A sampled <|video_pad|> would be read as one more video slot when the response is
    re-scored ("video features and video tokens do not match"). At temperature 50 the untrained
    model samples nearly uniformly, so 32 × 24 draws would hit the 4 vision tokens of this
    small vocabulary many times over if they were allowed."""
    engine = HFRolloutEngine(tiny_vl_dir)
    banned = vision_token_ids(engine.tokenizer)
    assert len(banned) == 4 and len(engine.tokenizer) < 400
    rows = ColourTask().sample(32, "test", np.random.default_rng(5))
    batch = engine.generate([r["prompt"] for r in rows], SamplingConfig(temperature=50.0, max_new_tokens=24), rows,
                            seed=0)
    m = batch["completion_mask"].bool()
    sampled = batch["completion_ids"][m]
    assert len(sampled) > 200 and not torch.isin(sampled, torch.tensor(banned)).any()
    with torch.no_grad():
        lp = completion_forward(engine.model, batch)["logprobs"]  # re-scoring works
    assert torch.isfinite(lp[m]).all()


def test_pixel_frames_on_a_text_model_fail_with_the_fix(tiny_model_dir):
    engine = HFRolloutEngine(tiny_model_dir)
    with pytest.raises(ConfigError, match="tiny-vl"):
        engine.generate(["q"], SamplingConfig(max_new_tokens=2), [{"frames": np.zeros((2, 56, 56, 3), np.uint8)}])


# -- actors on Ray -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vl_graph(ray_local, tiny_vl_dir):
    g = ActorGraph([
        Role("rollout", HFRolloutEngine, num_cpus=0.5, kwargs={"model_path": tiny_vl_dir}),
        Role("learner", Learner, num_cpus=1, kwargs={"model_path": tiny_vl_dir, "config": {"lr": 1e-2}, "max_len": 4}),
        Role("ref", Scorer, num_cpus=0.5, kwargs={"model_path": tiny_vl_dir}),
    ], timeout_s=120, call_timeout_s=120).start()
    yield g
    g.shutdown()


def frame_rows(seed):
    rows = ColourTask().sample(3, "train", np.random.default_rng(seed))
    rows.append({"prompt": "Which frame is brightest? A. first B. last", "answer": "A",
                 "frames": np.random.default_rng(seed).integers(0, 256, (7, 60, 80, 3), dtype=np.uint8)})
    return rows * 2


@pytest.mark.timeout(240)
def test_engine_logprobs_equal_learner_and_scorer_recompute_with_frames(vl_graph):
    g, rows = vl_graph, frame_rows(0)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4)
    batch = g["rollout"].call("generate", [r["prompt"] for r in rows], sampling, rows, seed=3,
                              option_letters=["ABCD"] * 6 + ["AB"] * 2)[0]
    assert batch["video_grid_thw"].tolist()[:4] == [[4, 4, 4]] * 3 + [[4, 2, 4]]  # the 60×80 video → 28×56
    assert batch["pixel_values_videos"].shape == (8, 64, 1176)
    lp = batch["option_logprobs"]
    assert lp.shape == (8, 4) and torch.isfinite(lp[:6]).all() and torch.isinf(lp[6:, 2:]).all()
    # a second engine call with other prompt widths: concat left-pads the prompts, the learner still agrees
    other = g["rollout"].call("generate", ["Colour?"] * 2, sampling, frame_rows(1)[:2], seed=4,
                              option_letters=["ABCD"] * 2)[0]
    both = Batch.concat([batch, other])
    m = both["completion_mask"].bool()
    learner_lp = g["learner"].call("logprobs", both)[0]
    ref_lp = g["ref"].call("logprobs", both)[0]["logprobs"]
    assert torch.allclose(learner_lp[m], both["logprobs"][m], atol=1e-4)
    assert torch.allclose(ref_lp[m], both["logprobs"][m], atol=1e-4)


@pytest.mark.timeout(240)
def test_learner_update_reaches_the_vl_engine(vl_graph):
    g, rows = vl_graph, frame_rows(5)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4)
    batch = g["rollout"].call("generate", [r["prompt"] for r in rows], sampling, rows, seed=1)[0]
    before = g["learner"].call("logprobs", batch)[0]
    metrics = g["learner"].call("update", batch, {"advantages": torch.linspace(-1, 1, 8)})[0]
    assert metrics["grad_norm"] > 0
    assert not torch.allclose(before, g["learner"].call("logprobs", batch)[0])
    update = g["learner"].wait([g["learner"][0].publish_weights.remote()], "publish")[0]
    assert g["rollout"].call("load_weights", update)[0] == update.version
    fresh = g["rollout"].call("generate", [r["prompt"] for r in rows], sampling, rows, seed=2)[0]
    m = fresh["completion_mask"].bool()
    assert fresh.meta["version"] == update.version
    assert torch.allclose(g["learner"].call("logprobs", fresh)[0][m], fresh["logprobs"][m], atol=1e-4)


# -- SFT -------------------------------------------------------------------------------------------------
@pytest.fixture
def one_thread():
    # Two threads on two shared cores slow these small ops down several-fold whenever anything else runs.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_vl_sft_learns_the_colour_from_the_frames(troupe_cache, one_thread):
    from troupe.algorithms.sft import ModelConfig, SFTConfig, prepare_policy

    cfg = ModelConfig(path="tiny-vl", sft=SFTConfig(steps=80, batch_size=16, lr=3e-3))
    path = prepare_policy(cfg, ColourTask(), {"task": "colour"})
    info = json.loads((path / "sft.json").read_text())
    assert info["final_loss"] < 0.1  # without the pixels the floor is ln(3)/2 ≈ 0.55 per answer token
    rows = ColourTask().sample(24, "test", np.random.default_rng(9))
    out = HFRolloutEngine(str(path)).generate([r["prompt"] for r in rows], SamplingConfig(temperature=0, max_new_tokens=2),
                                              rows, option_letters=["ABCD"] * len(rows))
    gold = torch.tensor(["ABC".index(r["answer"]) for r in rows])
    assert (out["option_logprobs"].argmax(1) == gold).float().mean() > 0.9


def test_text_checkpoint_key_ignores_the_vl_spec():
    from troupe.algorithms.sft import ModelConfig, _key_fields

    assert "tiny_vl" not in _key_fields(ModelConfig()) and "tiny" in _key_fields(ModelConfig())
    assert "tiny" not in _key_fields(ModelConfig(path="tiny-vl"))
