"""Real-benchmark adapters on tiny files written in each benchmark's own format.

Every frame of a fixture video has a flat background whose grey level encodes the frame's
index (``LEVEL0 + STEP * i``), so a decoded frame tells which source frame it is, even
through a lossy codec.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from troupe.envs.video_qa.items import ABSTAIN_OPTION, VideoItem
from troupe.envs.video_qa.real import (
    LOADERS,
    YES_NO_OPTIONS,
    load_mvbench,
    load_nextqa,
    load_real,
    load_tempcompass,
    read_clip,
    read_frames,
    sample_indices,
    segment_to_frames,
)
from troupe.platform.errors import ConfigError, DataError, RegistryError

av = pytest.importorskip("av")
if not any(c in av.codecs_available for c in ("mpeg4", "libx264")):
    pytest.skip("this PyAV build has neither an mpeg4 nor a libx264 encoder", allow_module_level=True)

LEVEL0, STEP, SIDE, FPS, N = 8, 15, 32, 8, 16  # 16 frames at 8 fps: frame i at i/8 s


def frame_image(i: int) -> np.ndarray:
    img = np.full((SIDE, SIDE, 3), LEVEL0 + STEP * i, np.uint8)
    img[20:28, i : i + 8] = 255  # a white square moving right; the top rows stay flat
    return img


def frame_index(frame: np.ndarray) -> int:
    return round((float(np.median(frame[:12, :, :])) - LEVEL0) / STEP)


CODECS = [c for c in ("mpeg4", "libx264") if c in av.codecs_available]


def write_video(path: Path, n: int = N, fps: int = FPS, codec: str = CODECS[0]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=fps)
        s.width = s.height = SIDE
        s.pix_fmt = "yuv420p"
        # near-lossless grey levels; x264 with B-frames stores packets out of presentation order
        s.options = {"qscale": "2"} if codec == "mpeg4" else {"crf": "10", "bf": "3"}
        for i in range(n):
            for p in s.encode(av.VideoFrame.from_ndarray(frame_image(i), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def write_frame_folder(path: Path, n: int = 12) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for i in range(n):  # unpadded names: natural order puts frame_2 before frame_10
        Image.fromarray(frame_image(i)).save(path / f"frame_{i + 1}.png")
    return path


def indices_of(frames: np.ndarray) -> list[int]:
    return [frame_index(f) for f in frames]


@pytest.fixture(scope="module")
def video(tmp_path_factory) -> Path:
    return write_video(tmp_path_factory.mktemp("vid") / "clip.mp4")


# ---------------------------------------------------------------------------- frames


def test_sample_indices_are_segment_centres_and_repeat_when_short():
    assert sample_indices(16, 8).tolist() == [1, 3, 5, 7, 9, 11, 13, 15]
    short = sample_indices(3, 8)
    assert short.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    with pytest.raises(ValueError):
        sample_indices(0, 8)


@pytest.mark.parametrize("codec", CODECS)
def test_read_video_samples_uniformly_with_timestamps(tmp_path, codec):
    video = write_video(tmp_path / "clip.mp4", codec=codec)
    clip = read_clip(video, num_frames=8)
    assert clip.frames.shape == (8, SIDE, SIDE, 3) and clip.frames.dtype == np.uint8
    assert clip.indices.tolist() == [1, 3, 5, 7, 9, 11, 13, 15]
    assert indices_of(clip.frames) == clip.indices.tolist()  # the pixels are those frames
    np.testing.assert_allclose(clip.timestamps, clip.indices / FPS)
    assert clip.num_source_frames == N
    assert not clip.frames.flags.writeable  # shared between the questions of one video

    resized = read_frames(video, num_frames=4, size=(24, 40))
    assert resized.shape == (4, 24, 40, 3)
    assert read_frames(video, num_frames=2, size=16).shape == (2, 16, 16, 3)


def test_read_video_window_and_short_clip_repeats(video):
    clip = read_clip(video, num_frames=4, start_s=0.5, end_s=1.0)  # frames 4..8
    assert clip.indices.tolist() == [4, 5, 7, 8]
    assert indices_of(clip.frames) == [4, 5, 7, 8]
    many = read_clip(video, num_frames=20)  # more than the 16 frames: repeats, in order
    assert len(many.frames) == 20 and np.all(np.diff(many.indices) >= 0) and set(many.indices) == set(range(N))


def test_read_frame_folder_natural_order(tmp_path):
    folder = write_frame_folder(tmp_path / "frames", n=12)
    clip = read_clip(folder, num_frames=4, fps=3.0)
    assert clip.indices.tolist() == [1, 4, 7, 10]
    assert indices_of(clip.frames) == [1, 4, 7, 10]  # frame_2.png, frame_5.png, ... not frame_10 first
    np.testing.assert_allclose(clip.timestamps, np.array([1, 4, 7, 10]) / 3.0)
    assert read_frames(folder, num_frames=3, size=(8, 8)).shape == (3, 8, 8, 3)


def test_segment_to_frames():
    t = [0.0, 0.25, 0.5, 0.75, 1.0]
    assert segment_to_frames(0.3, 0.8, t) == (2, 3)
    assert segment_to_frames(0.0, 1.0, t) == (0, 4)
    assert segment_to_frames(0.55, 0.7, t) is None  # between two sampled frames
    assert segment_to_frames(2.0, 3.0, t) is None


def test_frame_errors_name_the_path(tmp_path, video):
    missing = tmp_path / "nope.mp4"
    with pytest.raises(DataError, match="nope.mp4.*does not exist"):
        read_frames(missing)
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"this is not a video" * 10)
    with pytest.raises(DataError, match="junk.mp4.*cannot be decoded"):
        read_frames(junk)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty.*holds no"):
        read_frames(tmp_path / "empty")
    with pytest.raises(DataError, match="no frame lies in"):
        read_frames(video, start_s=5.0, end_s=6.0)


# ---------------------------------------------------------------------------- TempCompass


def tc_question(stem: str, options: list[str], answer: int) -> dict:
    lines = [stem] + [f"{chr(65 + i)}. {o}" for i, o in enumerate(options)]
    return {"question": "\n".join(lines), "answer": f"{chr(65 + answer)}. {options[answer]}"}


@pytest.fixture(scope="module")
def tempcompass(tmp_path_factory):
    root = tmp_path_factory.mktemp("tempcompass")
    write_video(root / "videos" / "1034419625.mp4")
    write_video(root / "videos" / "1034419625_reverse.mp4")
    data = {
        "1034419625": {
            "action": [tc_question("What is the man doing in the video?", ["dunking", "dribbling", "passing"], 0)],
            "direction": [tc_question("What is the direction of the man?", ["towards", "left to right"], 1)],
            "speed": [tc_question("What is the speed of the video?", ["normal", "slow motion", "fast"], 1)],
            "order": [tc_question("What happens first?", ["jump", "run", "sit", "stand"], 3)],
            "attribute_change": [tc_question("How does the sky change?", ["darker", "brighter"], 0)],
        },
        "1034419625_reverse": {
            "direction": [tc_question("What is the direction of the man?", ["towards", "right to left"], 1)],
        },
    }
    meta = {"1034419625": {"eval_dim": {"action": {"subject": "man"}, "speed": {"subject": "entire video"},
                                        "direction": None, "order": None, "attribute_change": None}}}
    (root / "questions").mkdir()
    (root / "questions" / "multi-choice.json").write_text(json.dumps(data))
    (root / "meta_info.json").write_text(json.dumps(meta))
    return root, data


def test_tempcompass_items(tempcompass):
    root, _ = tempcompass
    res = load_tempcompass(root / "questions" / "multi-choice.json", root / "videos",
                           meta_path=root / "meta_info.json")
    assert res.skipped == {} and len(res) == 6
    by_dim = {(it.meta["video_id"], it.meta["dimension"]): it for it in res.items}
    action = by_dim[("1034419625", "action")]
    assert isinstance(action, VideoItem) and action.source == "tempcompass"
    assert action.item_id == "tempcompass/1034419625/action/0"
    assert action.question == "What is the man doing in the video?"
    assert action.options == ["dunking", "dribbling", "passing", ABSTAIN_OPTION]
    assert action.answer == 0 and action.target == "man"
    assert action.frames.shape == (8, SIDE, SIDE, 3) and action.support is None and action.boxes is None
    assert indices_of(action.frames) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert by_dim[("1034419625", "speed")].target is None  # "entire video" is no object
    assert {d: it.qtype for (v, d), it in by_dim.items() if v == "1034419625"} == {
        "action": "action", "direction": "action_direction", "speed": "action",
        "order": "temporal_order", "attribute_change": "temporal_order"}
    rev = by_dim[("1034419625_reverse", "direction")]
    assert rev.meta["reversed"] and rev.answer == 1 and rev.gold_letter == "B"
    assert load_tempcompass(root / "questions" / "multi-choice.json", root / "videos", limit=2).items.__len__() == 2


def test_tempcompass_bad_answer_errors_or_is_counted(tempcompass, tmp_path):
    root, data = tempcompass
    bad = json.loads(json.dumps(data))
    bad["1034419625"]["order"][0]["answer"] = "E. fly"  # not among A-D
    del bad["1034419625"]["speed"][0]["question"]
    path = tmp_path / "mc.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"tempcompass/1034419625/speed/0.*'question'"):
        load_tempcompass(path, root / "videos")
    res = load_tempcompass(path, root / "videos", on_missing="skip")
    assert res.skipped == {"missing_field": 1, "bad_answer": 1} and len(res) == 4
    del bad["1034419625"]["speed"]
    path.write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"tempcompass/1034419625/order/0.*'answer' 'E. fly'"):
        load_tempcompass(path, root / "videos")


def cm_question(stem: str, label: str, options: list[str], answer: int) -> dict:
    """A caption-matching row as TempCompass writes it: labelled lines, the answer repeats one whole line."""
    marks = [str(i + 1) if label == "Option" else chr(65 + i) for i in range(len(options))]
    lines = [f"{label} {m}: {o}" for m, o in zip(marks, options, strict=True)]
    return {"question": "\n".join([stem, *lines]), "answer": lines[answer]}


@pytest.fixture(scope="module")
def tempcompass_tasks(tmp_path_factory):
    """``yes_no.json`` and ``caption_matching.json`` over three videos (one a reversed copy)."""
    root = tmp_path_factory.mktemp("tempcompass_tasks")
    for vid in ("1034419625", "1034419625_reverse", "1094590221"):
        write_video(root / "videos" / f"{vid}.mp4")
    yes_no = {
        "1034419625": {
            "action": [{"question": "Is the man dunking?", "answer": "yes"},
                       {"question": "Is the man dribbling a basketball?", "answer": "no"}],
            "direction": [{"question": "Is the man moving from left to right?", "answer": "yes"}],
        },
        "1034419625_reverse": {"direction": [{"question": "Is the man moving from left to right?", "answer": "no"}]},
        "1094590221": {
            "action": [{"question": "Is the man shooting basketball?", "answer": "yes"}],
            "speed": [{"question": "Is the video playing in slow motion?", "answer": "no"}],
        },
    }
    which = "Which caption matches the video better?"
    directions = ["The man is moving from right to left.", "The man is moving from left to right."]
    matching = {
        "1034419625": {
            "action": [cm_question("Which description is a more suitable match for the video?", "Option",
                                   ["The man is dribbling a basketball.", "A man is dunking a basketball."], 1),
                       cm_question("Which sentence better captures the essence of the video?", "Sentence",
                                   ["A man is dunking a basketball.", "A person passing a basketball."], 0)],
            "direction": [cm_question(which, "Caption", directions, 1)],
        },
        "1034419625_reverse": {"direction": [cm_question(which, "Caption", directions, 0)]},
        "1094590221": {"order": [cm_question(which, "Caption", ["The man dribbles, then shoots.",
                                                                "The man shoots, then dribbles."], 0)]},
    }
    (root / "questions").mkdir()
    (root / "questions" / "yes_no.json").write_text(json.dumps(yes_no))
    (root / "questions" / "caption_matching.json").write_text(json.dumps(matching))
    return root, yes_no, matching


def test_tempcompass_multi_choice_items_name_their_task(tempcompass):
    root, _ = tempcompass
    res = load_tempcompass(root / "questions" / "multi-choice.json", root / "videos", task="multi-choice")
    assert len(res) == 6 and {it.meta["task"] for it in res.items} == {"multi_choice"}


def test_tempcompass_yes_no_maps_yes_to_option_0_and_no_to_option_1(tempcompass_tasks):
    root, _, _ = tempcompass_tasks
    res = load_tempcompass(root / "questions" / "yes_no.json", root / "videos")
    assert res.skipped == {} and len(res) == 6
    assert YES_NO_OPTIONS == ["yes", "no"]
    by_id = {it.item_id: it for it in res.items}
    dunk = by_id["tempcompass/yes_no/1034419625/action/0"]
    assert dunk.question == "Is the man dunking?" and dunk.options == ["yes", "no", ABSTAIN_OPTION]
    assert dunk.answer == 0 and dunk.gold_letter == "A" and dunk.source == "tempcompass"
    assert by_id["tempcompass/yes_no/1034419625/action/1"].answer == 1
    assert dunk.meta | {"timestamps": None} == {"video_id": "1034419625", "dimension": "action", "index": 0,
                                                "task": "yes_no", "reversed": False, "timestamps": None}
    rev = by_id["tempcompass/yes_no/1034419625_reverse/direction/0"]
    assert rev.meta["reversed"] and rev.answer == 1 and rev.qtype == "action_direction"
    assert [it.answer for it in res.items] == [0, 1, 0, 1, 0, 1]
    assert {(it.meta["video_id"], it.meta["dimension"]): it.qtype for it in res.items}[("1094590221", "speed")] == "action"
    assert indices_of(dunk.frames) == [1, 3, 5, 7, 9, 11, 13, 15]


def test_tempcompass_caption_matching_reads_every_label_style_and_whole_line_answers(tempcompass_tasks):
    root, _, matching = tempcompass_tasks
    res = load_tempcompass(root / "questions" / "caption_matching.json", root / "videos")
    assert res.skipped == {} and len(res) == 5
    by_id = {it.item_id: it for it in res.items}
    opt = by_id["tempcompass/caption_matching/1034419625/action/0"]
    assert opt.question == "Which description is a more suitable match for the video?"
    assert opt.options == ["The man is dribbling a basketball.", "A man is dunking a basketball.", ABSTAIN_OPTION]
    assert opt.answer == 1 and opt.meta["labels"] == ["Option 1", "Option 2"] and opt.meta["task"] == "caption_matching"
    sent = by_id["tempcompass/caption_matching/1034419625/action/1"]
    assert sent.answer == 0 and sent.meta["labels"] == ["Sentence A", "Sentence B"]
    fwd = by_id["tempcompass/caption_matching/1034419625/direction/0"]
    rev = by_id["tempcompass/caption_matching/1034419625_reverse/direction/0"]
    assert fwd.options == rev.options and (fwd.answer, rev.answer) == (1, 0)  # the reversed copy flips the gold
    assert fwd.meta["labels"] == ["Caption A", "Caption B"] and rev.meta["reversed"]
    assert by_id["tempcompass/caption_matching/1094590221/order/0"].qtype == "temporal_order"
    for it in res.items:  # the gold option is the line the answer repeats
        q = matching[it.meta["video_id"]][it.meta["dimension"]][it.meta["index"]]
        assert q["answer"] == f"{it.meta['labels'][it.answer]}: {it.options[it.answer]}"
    assert len(load_real("tempcompass", annotation_path=root / "questions" / "caption_matching.json",
                         video_root=root / "videos", task="caption_matching", limit=2)) == 2


def test_tempcompass_caption_matching_accepts_the_label_alone_or_the_text_alone(tempcompass_tasks, tmp_path):
    root, _, matching = tempcompass_tasks
    rows = json.loads(json.dumps(matching))
    rows["1034419625"]["action"][0]["answer"] = "Option 2"
    rows["1034419625"]["action"][1]["answer"] = "A man is dunking a basketball."
    path = tmp_path / "cm.json"
    path.write_text(json.dumps(rows))
    res = load_tempcompass(path, root / "videos")  # the task comes from the layout, not the file name
    assert [it.answer for it in res.items[:2]] == [1, 0] and res.items[0].meta["task"] == "caption_matching"


def test_tempcompass_answers_matching_no_option_name_the_row(tempcompass_tasks, tmp_path):
    root, yes_no, matching = tempcompass_tasks
    bad_yn = json.loads(json.dumps(yes_no))
    bad_yn["1034419625"]["direction"][0]["answer"] = "maybe"
    (tmp_path / "yes_no.json").write_text(json.dumps(bad_yn))
    with pytest.raises(DataError, match=r"tempcompass/yes_no/1034419625/direction/0.*'answer' 'maybe'.*\['yes', 'no'\]"):
        load_tempcompass(tmp_path / "yes_no.json", root / "videos")
    res = load_tempcompass(tmp_path / "yes_no.json", root / "videos", on_missing="skip")
    assert res.skipped == {"bad_answer": 1} and len(res) == 5

    bad_cm = json.loads(json.dumps(matching))
    bad_cm["1034419625"]["direction"][0]["answer"] = "Caption C: The man is moving upwards."  # no line C
    bad_cm["1034419625_reverse"]["direction"][0]["answer"] = "Caption A: The man is moving upwards."  # wrong text
    mixed = "Which caption matches the video better?\nCaption A: one\nSentence B: two"  # two label styles
    bad_cm["1094590221"]["order"][0] = {"question": mixed, "answer": "Caption A: one"}
    (tmp_path / "caption_matching.json").write_text(json.dumps(bad_cm))
    with pytest.raises(DataError, match=r"caption_matching/1034419625/direction/0.*'Caption C: .*"
                                        r"not one of its options \['Caption A: The man is moving from right"):
        load_tempcompass(tmp_path / "caption_matching.json", root / "videos")
    res = load_tempcompass(tmp_path / "caption_matching.json", root / "videos", on_missing="skip")
    assert res.skipped == {"bad_answer": 2, "bad_options": 1} and len(res) == 2


def test_tempcompass_task_must_agree_with_the_file_layout(tempcompass, tempcompass_tasks):
    root, _, _ = tempcompass_tasks
    with pytest.raises(DataError, match=r"yes_no.json' holds yes_no questions \(e.g. 1034419625/action/0: "
                                        r"'Is the man dunking\?' answered 'yes'\), not multi_choice; "
                                        r"pass task='yes_no'"):
        load_tempcompass(root / "questions" / "yes_no.json", root / "videos", task="multi_choice")
    mc_root, _ = tempcompass
    with pytest.raises(DataError, match="holds multi_choice questions.*pass task='multi_choice'.*caption_matching.json"):
        load_tempcompass(mc_root / "questions" / "multi-choice.json", mc_root / "videos", task="Caption Matching")


def test_tempcompass_unknown_task_and_captioning_are_refused(tempcompass_tasks, tmp_path):
    root, _, _ = tempcompass_tasks
    ann = root / "questions" / "yes_no.json"
    with pytest.raises(DataError, match=r"unknown TempCompass task 'open_ended'; known: multi_choice, yes_no, "
                                        r"caption_matching \(the files questions/multi-choice.json"):
        load_tempcompass(ann, root / "videos", task="open_ended")
    with pytest.raises(DataError, match="'captioning' asks for a free-text caption.*no options"):
        load_tempcompass(ann, root / "videos", task="captioning")
    info = ("Identify the information consistent with the video and generate a caption.\n"
            "Information A: {'subject': 'man', 'action': 'dribbling'}\n"
            "Information B: {'subject': 'man', 'action': 'dunking'}\nGenerated Caption:")
    (tmp_path / "captioning.json").write_text(json.dumps({"1034419625": {"action": [
        {"question": info, "answer": "B. dunking"}]}}))
    with pytest.raises(DataError, match=r"captioning.json' holds captioning questions \(e.g. 1034419625/action/0\)"):
        load_tempcompass(tmp_path / "captioning.json", root / "videos")


def test_tempcompass_file_in_no_known_layout_is_an_error(tempcompass_tasks, tmp_path):
    root, _, _ = tempcompass_tasks
    flat = [{"video_id": "1034419625", "dim": "action", "question": "Is the man dunking?", "answer": "yes"}]
    (tmp_path / "rows.json").write_text(json.dumps(flat))
    with pytest.raises(DataError, match=r"rows.json' holds a list; the known layout is \{video_id: \{dimension: "
                                        r"\[\{question, answer\}, ...\]\}\}, as in TempCompass's questions/"):
        load_tempcompass(tmp_path / "rows.json", root / "videos")
    (tmp_path / "flat.json").write_text(json.dumps({"1034419625": [{"question": "q", "answer": "yes"}]}))
    with pytest.raises(DataError, match="video '1034419625' must map dimension names to lists of questions"):
        load_tempcompass(tmp_path / "flat.json", root / "videos")
    odd = {"1034419625": {"action": [{"prompt": "Is the man dunking?", "label": 1}]}}
    (tmp_path / "odd.json").write_text(json.dumps(odd))
    with pytest.raises(DataError, match=r"odd.json' is in none of the known layouts \(multi_choice: .*yes_no: .*"
                                        r"caption_matching: .*e.g. 1034419625/action/0: \{'prompt'"):
        load_tempcompass(tmp_path / "odd.json", root / "videos", on_missing="skip")


# ---------------------------------------------------------------------------- MVBench


@pytest.fixture(scope="module")
def mvbench(tmp_path_factory):
    root = tmp_path_factory.mktemp("mvbench")
    write_video(root / "video" / "star" / "Charades_v1_480" / "ZS9XR.mp4")
    write_video(root / "video" / "Moments_in_Time_Raw" / "videos" / "run.mp4")
    write_frame_folder(root / "video" / "tvqa" / "frames_fps3_hq" / "s01e02_seg01_clip_00", n=12)
    (root / "json").mkdir()
    seq = [{"video": "ZS9XR.mp4", "question": "What happened after the person took the food?",
            "candidates": ["Ate the medicine.", "Tidied up the blanket.", "Put down the cup."],
            "answer": "Put down the cup.", "start": 0.5, "end": 1.0}]
    fine = [{"video": "run.mp4", "question": "What is the action performed by the person?",
             "candidates": ["running", "walking"], "answer": "running"},
            {"video": "gone.mp4", "question": "What is happening?", "candidates": ["a", "b"], "answer": "a"}]
    epi = [{"video": "s01e02_seg01_clip_00", "question": "Why did Ross leave?",
            "candidates": ["tired", "angry", "late"], "answer": "late", "start": 1.0, "end": 3.0}]
    for name, rows in [("action_sequence", seq), ("fine_grained_action", fine), ("episodic_reasoning", epi)]:
        (root / "json" / f"{name}.json").write_text(json.dumps(rows))
    return root


def test_mvbench_bound_crop_and_task_from_file_name(mvbench):
    res = load_mvbench(mvbench / "json" / "action_sequence.json", mvbench / "video", num_frames=4)
    (it,) = res.items
    assert it.item_id == "mvbench/action_sequence/0" and it.qtype == "temporal_order" and it.source == "mvbench"
    assert it.options[:3] == ["Ate the medicine.", "Tidied up the blanket.", "Put down the cup."]
    assert it.answer == 2 and it.support is None and it.meta["bound"] == (0.5, 1.0)
    assert indices_of(it.frames) == [4, 5, 7, 8]  # only frames inside [0.5, 1.0] s


def test_mvbench_bound_as_support(mvbench):
    res = load_mvbench(mvbench / "json" / "action_sequence.json", mvbench / "video", bound_mode="support")
    (it,) = res.items
    assert it.meta["timestamps"] == [i / FPS for i in (1, 3, 5, 7, 9, 11, 13, 15)]
    assert it.support == (2, 3)  # sampled frames 5 and 7 (0.625 s, 0.875 s) lie in [0.5, 1.0]


def test_mvbench_frame_folder_task(mvbench):
    res = load_mvbench(mvbench / "json" / "episodic_reasoning.json", mvbench / "video", num_frames=3, size=16)
    (it,) = res.items
    assert it.qtype == "causal" and it.frames.shape == (3, 16, 16, 3)
    assert all(1.0 <= t <= 3.0 for t in it.meta["timestamps"])  # 3 fps frames 3..9


def test_mvbench_missing_video_and_unknown_task(mvbench, tmp_path):
    ann = mvbench / "json" / "fine_grained_action.json"
    with pytest.raises(DataError, match=r"mvbench/fine_grained_action/1.*gone.mp4.*not found"):
        load_mvbench(ann, mvbench / "video")
    res = load_mvbench(ann, mvbench / "video", on_missing="skip")
    assert res.skipped == {"missing_video": 1} and [it.qtype for it in res.items] == ["action"]
    renamed = tmp_path / "mine.json"
    renamed.write_text(ann.read_text())
    with pytest.raises(DataError, match="unknown MVBench task 'mine'.*action_sequence"):
        load_mvbench(renamed, mvbench / "video")
    assert len(load_mvbench(renamed, mvbench / "video", task="Fine-grained Action", on_missing="skip")) == 1


def test_mvbench_answer_not_a_candidate(mvbench, tmp_path):
    rows = json.loads((mvbench / "json" / "fine_grained_action.json").read_text())[:1]
    rows[0]["answer"] = "swimming"
    (tmp_path / "fine_grained_action.json").write_text(json.dumps(rows))
    with pytest.raises(DataError, match=r"mvbench/fine_grained_action/0.*'answer' 'swimming'"):
        load_mvbench(tmp_path / "fine_grained_action.json", mvbench / "video")


# ---------------------------------------------------------------------------- NExT-QA

NEXT_COLS = ["video", "frame_count", "width", "height", "question", "answer", "qid", "type", "a0", "a1", "a2", "a3", "a4"]


def write_csv(path: Path, cols: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def nextqa(tmp_path_factory):
    root = tmp_path_factory.mktemp("nextqa")
    write_video(root / "NExTVideo" / "1164" / "4010069381.mp4")
    ann = root / "dataset"
    ann.mkdir()
    (ann / "map_vid_vidorID.json").write_text(json.dumps({"4010069381": "1164/4010069381"}))
    opts = ["roll the handle", "tap their feet", "strum the string", "hit with sticks", "pat with hand"]
    types = ["CW", "CH", "TN", "TC", "TP", "DC", "DL", "DO"]
    rows = [[4010069381, 369, 640, 480, f"question {t}", k % 5, k, t, *opts] for k, t in enumerate(types)]
    write_csv(ann / "val.csv", NEXT_COLS, rows)
    return root, ann, opts


def test_nextqa_items_via_map(nextqa):
    root, ann, opts = nextqa
    res = load_nextqa(ann / "val.csv", root / "NExTVideo")  # the map is found next to the CSV
    assert len(res) == 8 and res.skipped == {}
    assert [it.qtype for it in res.items] == ["causal", "causal", "temporal_order", "temporal_order",
                                              "temporal_order", "counting", "object_attribute", "object_attribute"]
    it = res.items[3]
    assert it.item_id == "nextqa/4010069381_3" and it.answer == 3 and it.options == [*opts, ABSTAIN_OPTION]
    assert it.split == "val" and it.source == "nextqa" and it.support is None
    assert it.meta["type"] == "TC" and it.meta["frame_count"] == 369
    assert indices_of(it.frames) == [1, 3, 5, 7, 9, 11, 13, 15]
    assert res.items[0].frames is it.frames  # one read per video


def test_nextgqa_text_answers_and_grounding(nextqa, tmp_path):
    root, _, opts = nextqa
    write_video(tmp_path / "videos" / "2435100235.mp4")
    cols = ["video_id", *NEXT_COLS[1:]]
    rows = [[2435100235, 16, 32, 32, "how does the man sell the watch", opts[2], 7, "CH", *opts],
            [2435100235, 16, 32, 32, "why did he stop", opts[1], 8, "CW", *opts]]
    ann = write_csv(tmp_path / "gqa_val.csv", cols, rows)
    gsub = {"2435100235": {"duration": 2, "location": {"7": [[0.3, 0.5], [0.6, 0.9]]}, "fps": 8}}
    (tmp_path / "gsub_val.json").write_text(json.dumps(gsub))
    res = load_nextqa(ann, tmp_path / "videos", grounding_path=tmp_path / "gsub_val.json")
    a, b = res.items
    assert a.answer == 2 and b.answer == 1 and a.split == "test"
    assert a.meta["support_s"] == (0.3, 0.9) and a.support == (1, 3)  # 0.375, 0.625, 0.875 s
    assert b.support is None


def test_nextqa_errors_and_skips(nextqa, tmp_path):
    root, _, opts = nextqa
    rows = [[4010069381, 1, 1, 1, "q ok", 0, 0, "CW", *opts],
            [4010069381, 1, 1, 1, "q bad answer", 7, 1, "CW", *opts],
            [4010069381, 1, 1, 1, "q no a2", 0, 2, "CW", opts[0], opts[1], "", opts[3], opts[4]],
            [999, 1, 1, 1, "q no video", 0, 3, "DC", *opts],
            [4010069381, 1, 1, 1, "q odd type", 0, 4, "XX", *opts]]
    ann = write_csv(tmp_path / "val.csv", NEXT_COLS, rows)
    vmap = tmp_path / "map.json"
    vmap.write_text(json.dumps({"4010069381": "1164/4010069381"}))
    with pytest.raises(DataError, match=r"nextqa/4010069381_1.*'answer' '7'"):
        load_nextqa(ann, root / "NExTVideo", map_path=vmap)
    res = load_nextqa(ann, root / "NExTVideo", map_path=vmap, on_missing="skip")
    assert res.skipped == {"bad_answer": 1, "missing_field": 1, "missing_video": 1, "unknown_type": 1}
    assert [it.question for it in res.items] == ["q ok"]
    with pytest.raises(DataError, match=r"nextqa/4010069381_2.*field 'a2'"):
        load_nextqa(write_csv(tmp_path / "two.csv", NEXT_COLS, [rows[0], rows[2]]), root / "NExTVideo", map_path=vmap)
    # without a map the video is <root>/<video>.mp4, and its absence names that path
    with pytest.raises(DataError, match=r"NExTVideo/4010069381.mp4.*does not exist"):
        load_nextqa(write_csv(tmp_path / "one.csv", NEXT_COLS, rows[:1]), root / "NExTVideo")
    with pytest.raises(DataError, match=r"lacks column\(s\) \['a4'\]"):
        load_nextqa(write_csv(tmp_path / "cols.csv", NEXT_COLS[:-1], [r[:-1] for r in rows]), root / "NExTVideo")


# ---------------------------------------------------------------------------- registry


def test_load_real_registry(nextqa):
    root, ann, _ = nextqa
    assert set(LOADERS) == {"tempcompass", "mvbench", "nextqa"}
    res = load_real("nextqa", annotation_path=ann / "val.csv", video_root=root / "NExTVideo", limit=3, num_frames=2)
    assert len(res) == 3 and res.items[0].frames.shape[0] == 2
    with pytest.raises(RegistryError, match="unknown real video-QA source 'videomme'; known: mvbench, nextqa, tempcompass"):
        load_real("videomme")
    with pytest.raises(ConfigError, match="on_missing"):
        load_real("nextqa", annotation_path=ann / "val.csv", video_root=root, on_missing="ignore")
    with pytest.raises(DataError, match="does not exist"):
        load_real("tempcompass", annotation_path=root / "none.json", video_root=root)
