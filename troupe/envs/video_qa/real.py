"""Real video-QA benchmarks read into ``VideoItem``s: TempCompass, MVBench and NExT-QA.

Frames
------
``read_clip`` / ``read_frames`` read a video file (PyAV) or a folder of frame images
(``.jpg``/``.jpeg``/``.png``, natural name order: ``2.png`` before ``10.png``) and keep
``num_frames`` frames sampled uniformly: the centre of each of ``num_frames`` equal segments
of the frames that lie in ``[start_s, end_s]`` (the whole clip by default), the rule MVBench
and TSN use. A clip with fewer frames than ``num_frames`` repeats frames (the centres fall on
the same frame) so every item has the same frame count; a clip with no frame at all, or no
frame in the window, is an error. Frame times are seconds from the first frame: packet
timestamps for a video, ``position / fps`` for a folder (``fps`` defaults to 3, the rate of
MVBench's only frame-folder task). ``segment_to_frames`` maps a segment in seconds onto the
sampled frames (the ``support`` of a ``VideoItem``). Loads read frames eagerly, once per
video and window, and the items of one video share one read-only array: pass ``size`` on
full benchmarks to bound memory; views copy before editing. Each item keeps its sampled
frame times in ``meta["timestamps"]``.

Annotation formats (checked against the public repositories named; the rest is assumed)
--------------------------------------------------------------------------------------
* **TempCompass** (llyx97/TempCompass ``questions/``, confirmed): three choice tasks, one file
  each, all ``{"<video_id>": {"<dimension>": [{"question": ..., "answer": ...}, ...]}}``:

  - ``multi-choice.json``: ``"stem\\nA. opt\\nB. opt"`` answered ``"B. opt"``; options are the
    lettered lines ending the question, the answer's letter decides and its text, when given,
    must equal that option.
  - ``yes_no.json``: a one-line question answered ``"yes"`` or ``"no"``; options
    ``["yes", "no"]``, so the gold index is 0 for yes and 1 for no.
  - ``caption_matching.json``: ``"stem\\nCaption A: text\\nCaption B: text"``, labelled
    ``Option 1:``/``Option 2:``, ``Sentence A:``/``Sentence B:`` or ``Caption A:``/``Caption B:``,
    answered with the whole chosen line (``"Caption B: text"``); the label decides and the
    text must equal that line's. The labels are kept in ``meta["labels"]``.

  The task is read from the rows' layout; ``task=`` (``multi_choice``, ``yes_no``,
  ``caption_matching``) must agree with it. ``captioning.json`` (free-text captions scored by
  an LLM judge) is recognised and refused. Dimensions: action, direction, speed, order,
  attribute_change, kept with the video id in ``meta``. Video ids include the reversed copies
  (``<id>_reverse``). Videos: ``<video_root>/<video_id>.mp4``. Item ids are
  ``tempcompass/<video_id>/<dimension>/<k>`` for multi-choice and
  ``tempcompass/<task>/<video_id>/<dimension>/<k>`` for the others. Optional ``meta_path``
  (``meta_info.json``, confirmed: ``{id: {"eval_dim": {dim: {"subject": ...} | null}}}``)
  fills ``target``.
* **MVBench** (OpenGVLab MVBench ``json/<task>.json``, confirmed via its evaluation
  notebook's ``data_list`` copied in many repositories): a list of
  ``{"video", "question", "candidates": [...], "answer": "<candidate text>"}``; the five
  tasks flagged "has start & end" carry ``"start"``/``"end"`` seconds. The task is the
  ``task`` argument or the file name; videos are looked up under the task's official
  folder (``<video_root>/star/Charades_v1_480/<video>`` ...) and then ``<video_root>/<video>``.
  ``episodic_reasoning`` videos are folders of 3 fps frames. A bound either crops the clip
  (``bound_mode="crop"``, the official protocol; no support) or marks the frames inside it
  as ``support`` over the whole video (``bound_mode="support"``).
* **NExT-QA** (doc-doc/NExT-QA ``dataset/nextqa/{train,val,test}.csv``, confirmed): columns
  ``video,frame_count,width,height,question,answer,qid,type,a0..a4`` with ``answer`` the
  option index. Also read: NExT-GQA's ``val.csv``/``test.csv`` (doc-doc/NExT-GQA, confirmed),
  which name the column ``video_id`` and give the answer as option text, and its
  ``gsub_<split>.json`` (``{video: {"location": {qid: [[s, e], ...]}}}``) via
  ``grounding_path``: the hull of a question's segments becomes its ``support``. Videos:
  ``<video_root>/<map[video]>.mp4`` with ``map_vid_vidorID.json`` (values like
  ``"1164/3238737531"``, no suffix; passed as ``map_path`` or found next to the CSV), else
  ``<video_root>/<video>.mp4``. ``split`` is the CSV's stem when it is train/val/test.

Question types: each source's table below maps its categories onto ``QTYPES``, with why.

Loads return ``LoadResult(items, skipped)``. A row that cannot become an item raises a
``DataError`` naming the item and the field, or with ``on_missing="skip"`` is dropped and
counted under one of ``SKIP_REASONS``. Damaged annotation files always raise.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from troupe.envs.video_qa.items import VideoItem
from troupe.platform.errors import ConfigError, DataError, RegistryError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
FOLDER_FPS = 3.0  # MVBench's TVQA frames (frames_fps3_hq), its only frame-folder task
SKIP_REASONS = ("missing_video", "unreadable_video", "empty_window", "missing_field", "bad_options",
                "bad_answer", "unknown_type", "bad_item")

# TempCompass dimension -> qtype. speed: the playback rate survives reversal and mostly
# shuffling (same frames), so it behaves like a direction-insensitive action; attribute_change
# ("from bud to full bloom") flips when reversed (TempCompass ships *_reverse videos for it),
# so it is an order question.
TEMPCOMPASS_QTYPES = {"action": "action", "direction": "action_direction", "speed": "action",
                      "order": "temporal_order", "attribute_change": "temporal_order"}

# MVBench task -> (qtype, official video folder, has start/end bound). Folders and bounds are
# the evaluation notebook's data_list; qtypes are our reading of each task's questions.
MVBENCH_TASKS: dict[str, tuple[str, str, bool]] = {
    "action_sequence": ("temporal_order", "star/Charades_v1_480", True),  # what happened after X
    "action_prediction": ("temporal_order", "star/Charades_v1_480", True),  # what happens next
    "action_antonym": ("action_direction", "ssv2_video", False),  # open vs close, push vs pull
    "fine_grained_action": ("action", "Moments_in_Time_Raw/videos", False),
    "unexpected_action": ("causal", "FunQA_test/test", False),  # why is it funny/surprising
    "object_existence": ("existence", "clevrer/video_validation", False),
    "object_interaction": ("object_attribute", "star/Charades_v1_480", True),  # which object was used
    "object_shuffle": ("temporal_order", "perception/videos", False),  # where it ends up: needs the sequence
    "moving_direction": ("action_direction", "clevrer/video_validation", False),
    "action_localization": ("temporal_order", "sta/sta_video", True),  # beginning / middle / end
    "scene_transition": ("temporal_order", "scene_qa/video", False),  # from scene A to scene B
    "action_count": ("counting", "perception/videos", False),
    "moving_count": ("counting", "clevrer/video_validation", False),
    "moving_attribute": ("object_attribute", "clevrer/video_validation", False),
    "state_change": ("temporal_order", "perception/videos", False),  # end state vs start: flips when reversed
    "fine_grained_pose": ("action_direction", "nturgbd", False),  # sit down vs stand up
    "character_order": ("temporal_order", "perception/videos", False),
    "egocentric_navigation": ("action_direction", "vlnqa", False),  # next move: turn left/right, forward
    "episodic_reasoning": ("causal", "tvqa/frames_fps3_hq", True),
    "counterfactual_inference": ("causal", "clevrer/video_validation", False),
}

# NExT-QA type -> qtype: causal why/how; temporal before-after (TN, with TP its "previous"
# half) and when/as (TC); descriptive count (DC); location (DL) and other (DO) ask what or
# where something is, which shuffling and reversing keep.
NEXTQA_QTYPES = {"CW": "causal", "CH": "causal", "TN": "temporal_order", "TC": "temporal_order",
                 "TP": "temporal_order", "DC": "counting", "DL": "object_attribute", "DO": "object_attribute"}


class ItemError(DataError):
    """One row or video cannot become an item; ``reason`` is what it is counted under when skipped."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass
class LoadResult:
    items: list[VideoItem]
    skipped: dict[str, int]  # reason (one of SKIP_REASONS) -> items dropped for it

    def __len__(self) -> int:
        return len(self.items)


# ---------------------------------------------------------------------------- frames


@dataclasses.dataclass
class Clip:
    frames: np.ndarray  # [F, H, W, 3] uint8, read-only
    timestamps: np.ndarray  # [F] seconds from the first frame of the source
    indices: np.ndarray  # [F] positions of the sampled frames among the source's frames
    num_source_frames: int


def sample_indices(n: int, num_frames: int) -> np.ndarray:
    """Centres of ``num_frames`` equal segments of ``range(n)``; repeats when ``n < num_frames``."""
    if n <= 0 or num_frames <= 0:
        raise ValueError(f"need n > 0 and num_frames > 0, got n={n}, num_frames={num_frames}")
    return np.minimum(((np.arange(num_frames) + 0.5) * n / num_frames).astype(int), n - 1)


def segment_to_frames(start_s: float, end_s: float, timestamps) -> tuple[int, int] | None:
    """The inclusive range of sampled frames whose time lies in ``[start_s, end_s]``, or None."""
    t = np.asarray(timestamps, dtype=float)
    inside = np.flatnonzero((t >= start_s - 1e-6) & (t <= end_s + 1e-6))
    return (int(inside[0]), int(inside[-1])) if inside.size else None


def read_frames(source, num_frames: int = 8, size=None, start_s: float | None = None,
                end_s: float | None = None, fps: float = FOLDER_FPS) -> np.ndarray:
    """``[F, H, W, 3]`` uint8 frames of a video file or frame folder; see ``read_clip``."""
    return read_clip(source, num_frames, size, start_s, end_s, fps).frames


def read_clip(source, num_frames: int = 8, size=None, start_s: float | None = None,
              end_s: float | None = None, fps: float = FOLDER_FPS) -> Clip:
    """Sample ``num_frames`` frames uniformly over the clip or over ``[start_s, end_s]`` seconds.

    ``size`` is ``(height, width)`` or an int for a square, resized with Pillow; ``fps`` is the
    frame rate of a frame folder (a video's own timestamps are used).
    """
    path = Path(source)
    if not path.exists():
        raise ItemError("missing_video", f"video {str(path)!r} does not exist")
    if path.is_dir():
        files = sorted((p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES), key=_natural_key)
        if not files:
            raise ItemError("unreadable_video", f"frame folder {str(path)!r} holds no {'/'.join(IMAGE_SUFFIXES)} images")
        times = np.arange(len(files)) / fps
        pos = _pick(times, num_frames, start_s, end_s, path)
        frames = [_load_image(files[i], size) for i in pos]
        shapes = {f.shape for f in frames}
        if len(shapes) > 1:
            raise ItemError("unreadable_video", f"frame folder {str(path)!r} mixes image sizes {sorted(shapes)}; pass size=")
    else:
        pts, to_s = _video_pts(path)
        times = (pts - pts[0]) * to_s
        pos = _pick(times, num_frames, start_s, end_s, path)
        frames = _decode(path, pts, pos, size)
    arr = np.stack(frames)
    arr.flags.writeable = False  # items of one video share this array; views must copy, not edit
    return Clip(arr, times[pos].astype(float), pos, len(times))


def _natural_key(p: Path) -> list:
    return [int(s) if s.isdigit() else s.lower() for s in re.split(r"(\d+)", p.name)]


def _pick(times: np.ndarray, num_frames: int, start_s, end_s, path: Path) -> np.ndarray:
    keep = np.ones(len(times), bool)
    if start_s is not None:
        keep &= times >= start_s - 1e-6
    if end_s is not None:
        keep &= times <= end_s + 1e-6
    cand = np.flatnonzero(keep)
    if not cand.size:
        raise ItemError("empty_window", f"{str(path)!r}: no frame lies in [{start_s}, {end_s}] s; "
                                        f"its {len(times)} frames span {times[0]:.2f}-{times[-1]:.2f} s")
    return cand[sample_indices(len(cand), num_frames)]


def _resize(img: Image.Image, size) -> np.ndarray:
    if size is not None:
        h, w = (size, size) if isinstance(size, int) else size
        img = img.resize((int(w), int(h)), Image.BILINEAR)
    return np.asarray(img, dtype=np.uint8)


def _load_image(p: Path, size) -> np.ndarray:
    try:
        with Image.open(p) as img:
            return _resize(img.convert("RGB"), size)
    except OSError as e:
        raise ItemError("unreadable_video", f"frame {str(p)!r} cannot be read: {e}") from e


def _require_av():
    try:
        import av  # lazy: only real-data runs need PyAV
    except ImportError as e:
        raise ConfigError("reading video files needs PyAV: pip install 'troupe[video]' (or pip install av)") from e
    return av


def _open_video(path: Path):
    av = _require_av()

    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as e:
        raise ItemError("unreadable_video", f"video {str(path)!r} cannot be decoded: {e}") from e
    if not container.streams.video:
        container.close()
        raise ItemError("unreadable_video", f"video {str(path)!r} has no video stream")
    return container


def _video_pts(path: Path) -> tuple[np.ndarray, float]:
    """Sorted presentation timestamps of every frame, read from packets without decoding."""
    av = _require_av()

    with _open_video(path) as c:
        stream = c.streams.video[0]
        try:
            stamps = [p.pts if p.pts is not None else p.dts for p in c.demux(stream) if p.size]
        except av.FFmpegError as e:
            raise ItemError("unreadable_video", f"video {str(path)!r} cannot be demuxed: {e}") from e
        stamps = sorted(s for s in stamps if s is not None)
        if not stamps:
            raise ItemError("unreadable_video", f"video {str(path)!r} holds no timestamped frames")
        return np.asarray(stamps, dtype=np.int64), float(stream.time_base)


def _decode(path: Path, pts: np.ndarray, pos: np.ndarray, size) -> list[np.ndarray]:
    av = _require_av()

    wanted = {int(pts[i]) for i in pos}
    got: dict[int, np.ndarray] = {}
    with _open_video(path) as c:
        stream = c.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for k, frame in enumerate(c.decode(stream)):
                # Decoders emit presentation order, so the k-th frame stands in for a missing pts.
                key = frame.pts if frame.pts is not None else (int(pts[k]) if k < len(pts) else -1)
                if key in wanted and key not in got:
                    got[key] = _resize(frame.to_image(), size)  # RGB conversion only for kept frames
                    if len(got) == len(wanted):
                        break  # skip decoding the tail
        except av.FFmpegError as e:
            raise ItemError("unreadable_video", f"video {str(path)!r} fails to decode: {e}") from e
    missing = sorted(wanted - got.keys())
    if missing:
        raise ItemError("unreadable_video", f"video {str(path)!r}: {len(missing)} sampled frames did not decode "
                                            f"(timestamps {missing[:4]}); the file may be damaged")
    return [got[int(pts[i])] for i in pos]


class _ClipCache:
    """Reads each (video, window) once per load: benchmarks ask several questions of a video."""

    def __init__(self, num_frames: int, size, fps: float = FOLDER_FPS) -> None:
        self.num_frames, self.size, self.fps = num_frames, size, fps
        self._clips: dict[tuple, Clip | ItemError] = {}

    def get(self, path: Path, start_s=None, end_s=None) -> Clip:
        key = (str(path), start_s, end_s)
        if key not in self._clips:
            try:
                self._clips[key] = read_clip(path, self.num_frames, self.size, start_s, end_s, self.fps)
            except ItemError as e:
                self._clips[key] = e  # a broken video fails once, not once per question
        hit = self._clips[key]
        if isinstance(hit, ItemError):
            raise ItemError(hit.reason, str(hit))
        return hit


# ---------------------------------------------------------------------------- shared parsing


def _collect(source: str, rows: Iterable[tuple[str, Any]], build: Callable[[str, Any], VideoItem],
             on_missing: str, limit: int | None) -> LoadResult:
    if on_missing not in ("error", "skip"):
        raise ConfigError(f"on_missing must be 'error' or 'skip', got {on_missing!r}")
    items: list[VideoItem] = []
    skipped: Counter = Counter()
    for item_id, row in rows:
        if limit is not None and len(items) >= limit:
            break
        try:
            items.append(build(item_id, row))
        except ItemError as e:
            if on_missing == "error":
                raise DataError(f"{source} item {item_id!r}: {e} "
                                f"(on_missing='skip' drops such items and counts them)") from e
            skipped[e.reason] += 1
    return LoadResult(items, dict(skipped))


def _field(row: dict, key: str) -> Any:
    value = row.get(key) if isinstance(row, dict) else None
    if value is None or (isinstance(value, str) and not value.strip()):
        have = sorted(k for k, v in row.items() if v not in (None, "")) if isinstance(row, dict) else type(row).__name__
        raise ItemError("missing_field", f"field {key!r} is missing or empty; the row has {have}")
    return value


def _seconds(row: dict, key: str) -> float:
    value = _field(row, key)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ItemError("missing_field", f"field {key!r} is {value!r}, not a number of seconds") from None


def _make_item(**kw: Any) -> VideoItem:
    try:
        return VideoItem(**kw)
    except DataError as e:  # e.g. more options than letters
        raise ItemError("bad_item", str(e)) from e


def _read_json(path, kind: type, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} file {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{what} file {str(path)!r} is not valid JSON: {e}") from e
    if not isinstance(data, kind):
        raise DataError(f"{what} file {str(path)!r} holds a {type(data).__name__}, expected a {kind.__name__}")
    return data


_OPTION_LINE = re.compile(r"^\s*\(?([A-Z])[.)]\s*(.*?)\s*$")


def parse_lettered_question(text: str) -> tuple[str, list[str]]:
    """``"stem\\nA. x\\nB. y"`` -> ``("stem", ["x", "y"])``; options are the lettered lines ending the text."""
    lines = text.strip().split("\n")
    first = len(lines)
    while first > 0 and _OPTION_LINE.match(lines[first - 1]):
        first -= 1
    letters = [_OPTION_LINE.match(line).group(1) for line in lines[first:]]
    if len(letters) < 2 or letters != [chr(ord("A") + i) for i in range(len(letters))]:
        raise ItemError("bad_options", f"field 'question' does not end in options lettered A, B, ...: {text!r}")
    return "\n".join(lines[:first]).strip(), [_OPTION_LINE.match(line).group(2) for line in lines[first:]]


def _norm(s: str) -> str:
    return " ".join(str(s).split()).lower()


# ---------------------------------------------------------------------------- TempCompass

# TempCompass's choice tasks -> their file in the repository's questions/ directory.
TEMPCOMPASS_TASKS = {"multi_choice": "multi-choice.json", "yes_no": "yes_no.json",
                     "caption_matching": "caption_matching.json"}
YES_NO_OPTIONS = ["yes", "no"]  # gold index 0 for "yes", 1 for "no"
_MATCH_LINE = re.compile(r"^\s*(Option|Sentence|Caption) (\d+|[A-Z])\s*:\s*(.*?)\s*$")
_INFO_LINE = re.compile(r"^\s*Information [A-Z]:")  # captioning's hints
_LAYOUTS = ("multi_choice: 'stem\\nA. opt\\nB. opt' answered 'B. opt'; yes_no: one question answered "
            "'yes' or 'no'; caption_matching: 'stem\\nCaption A: text\\nCaption B: text' (or Option 1:, "
            "Sentence A:) answered with the whole chosen line")


def tempcompass_task_name(name: str) -> str:
    """``"multi-choice"`` / ``"yes_no.json"`` / ``"Caption Matching"`` -> the key of ``TEMPCOMPASS_TASKS``."""
    key = re.sub(r"[\s\-]+", "_", Path(str(name)).stem.strip().lower())
    if key == "captioning":
        raise DataError("TempCompass task 'captioning' asks for a free-text caption, scored by an LLM judge; "
                        "it has no options to load. Load multi-choice.json, yes_no.json or caption_matching.json")
    if key not in TEMPCOMPASS_TASKS:
        raise DataError(f"unknown TempCompass task {str(name)!r}; known: {', '.join(TEMPCOMPASS_TASKS)} "
                        f"(the files questions/{', questions/'.join(TEMPCOMPASS_TASKS.values())})")
    return key


def parse_matching_question(text: str) -> tuple[str, list[str], list[str]]:
    """``"stem\\nCaption A: x\\nCaption B: y"`` -> ``("stem", ["x", "y"], ["Caption A", "Caption B"])``.

    The labelled lines end the text and share one label (``Option``, ``Sentence`` or ``Caption``)
    numbered 1, 2, ... or lettered A, B, ...
    """
    lines = text.strip().split("\n")
    first = len(lines)
    while first > 0 and _MATCH_LINE.match(lines[first - 1]):
        first -= 1
    found = [_MATCH_LINE.match(line) for line in lines[first:]]
    marks = [m.group(2) for m in found]
    in_order = marks in ([str(i + 1) for i in range(len(marks))], [chr(ord("A") + i) for i in range(len(marks))])
    if len(found) < 2 or len({m.group(1) for m in found}) > 1 or not in_order:
        raise ItemError("bad_options", f"field 'question' does not end in labelled lines 'Option 1:', 'Option 2:', "
                                       f"... (or 'Sentence A:' / 'Caption A:', ...): {text!r}")
    return ("\n".join(lines[:first]).strip(), [m.group(3) for m in found],
            [f"{m.group(1)} {m.group(2)}" for m in found])


def _lettered_answer(answer: str, options: list[str]) -> int:
    """Index of a multi-choice answer ("B. text", "B", "(B) text" or a bare option text), or -1."""
    m = _OPTION_LINE.match(answer)
    if m:  # the letter decides; its text, when given, must be that option's
        idx = ord(m.group(1)) - ord("A")
        return idx if idx < len(options) and (not m.group(2) or _norm(m.group(2)) == _norm(options[idx])) else -1
    return next((i for i, o in enumerate(options) if _norm(o) == _norm(answer)), -1)


def _matching_answer(answer: str, options: list[str], labels: list[str]) -> int:
    """Index of a caption-matching answer (the whole line "Caption B: text", its label, or its text), or -1."""
    m = re.match(r"^\s*(Option|Sentence|Caption) (\d+|[A-Z])\s*(?::\s*(.*?))?\s*$", answer)
    if m:
        label = f"{m.group(1)} {m.group(2)}"
        idx = labels.index(label) if label in labels else -1
        return idx if idx >= 0 and (not m.group(3) or _norm(m.group(3)) == _norm(options[idx])) else -1
    return next((i for i, o in enumerate(options) if _norm(o) == _norm(answer)), -1)


def _tempcompass_layout(q: Any) -> str | None:
    """The task whose layout one question row has (``"captioning"`` included), or None."""
    if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not isinstance(q.get("answer"), str):
        return None
    lines = q["question"].strip().split("\n")
    if any(_INFO_LINE.match(line) for line in lines):
        return "captioning"
    if len(lines) > 1 and _OPTION_LINE.match(lines[-1]):
        return "multi_choice"
    if len(lines) > 1 and _MATCH_LINE.match(lines[-1]):
        return "caption_matching"
    if q["answer"].strip().lower().rstrip(".") in YES_NO_OPTIONS:
        return "yes_no"
    return None


def _tempcompass_rows(data: Any, path) -> list[tuple[str, str, int, Any]]:
    """``(video_id, dimension, k, question row)`` of a ``{video_id: {dimension: [row, ...]}}`` file."""
    where = f"TempCompass annotation {str(path)!r}"
    layout = ("{video_id: {dimension: [{question, answer}, ...]}}, as in TempCompass's questions/"
              f"{', questions/'.join(TEMPCOMPASS_TASKS.values())}")
    if not isinstance(data, dict):
        raise DataError(f"{where} holds a {type(data).__name__}; the known layout is {layout}")
    rows = []
    for vid, dims in data.items():
        if not isinstance(dims, dict) or not all(isinstance(qs, list) for qs in dims.values()):
            raise DataError(f"{where}: video {vid!r} must map dimension names to lists of questions; "
                            f"the known layout is {layout}")
        rows += [(vid, dim, k, q) for dim, qs in dims.items() for k, q in enumerate(qs)]
    return rows


def _tempcompass_file_task(rows: list, task: str | None, path) -> str:
    """The task of a file: its rows' layout (the first row that has one), checked against ``task``."""
    where = f"TempCompass annotation {str(path)!r}"
    found = next(((layout, row) for row in rows if (layout := _tempcompass_layout(row[3])) is not None), None)
    if found is None:
        if rows:
            vid, dim, k, q = rows[0]
            raise DataError(f"{where} is in none of the known layouts ({_LAYOUTS}); no question row reads as one, "
                            f"e.g. {vid}/{dim}/{k}: {q!r}. Use a file of TempCompass's questions/ directory")
        return task or "multi_choice"  # an empty file loads no items whatever its task
    layout, (vid, dim, k, q) = found
    if layout == "captioning":
        raise DataError(f"{where} holds captioning questions (e.g. {vid}/{dim}/{k}), which ask for a free-text "
                        f"caption scored by an LLM judge and have no options to load; use "
                        f"{', '.join(TEMPCOMPASS_TASKS.values())} instead")
    if task is not None and task != layout:
        raise DataError(f"{where} holds {layout} questions (e.g. {vid}/{dim}/{k}: {q['question']!r} answered "
                        f"{q['answer']!r}), not {task}; pass task={layout!r}, or the {TEMPCOMPASS_TASKS[task]} file")
    return layout


def load_tempcompass(annotation_path, video_root, num_frames: int = 8, size=None, limit: int | None = None,
                     on_missing: str = "error", *, meta_path=None, task: str | None = None) -> LoadResult:
    """TempCompass multi-choice, yes/no or caption-matching questions (``questions/<task>.json``).

    The task is read from the file's layout; ``task`` (a name of ``TEMPCOMPASS_TASKS``), when
    given, must agree with it. See the module doc.
    """
    task = tempcompass_task_name(task) if task is not None else None
    rows = _tempcompass_rows(_read_json(annotation_path, object, "TempCompass annotation"), annotation_path)
    task = _tempcompass_file_task(rows, task, annotation_path)
    meta_info = _read_json(meta_path, dict, "TempCompass meta_info") if meta_path is not None else {}
    clips, root = _ClipCache(num_frames, size), Path(video_root)

    def parse(q) -> tuple[str, list[str], int, dict]:
        question, answer = str(_field(q, "question")), str(_field(q, "answer"))
        extra: dict[str, Any] = {}
        if task == "multi_choice":
            stem, options = parse_lettered_question(question)
            idx = _lettered_answer(answer, options)
            lines = options
        elif task == "caption_matching":
            stem, options, labels = parse_matching_question(question)
            idx = _matching_answer(answer, options, labels)
            lines, extra = [f"{lab}: {o}" for lab, o in zip(labels, options, strict=True)], {"labels": labels}
        else:
            stem, options = question.strip(), list(YES_NO_OPTIONS)
            idx = options.index(a) if (a := answer.strip().lower().rstrip(".")) in options else -1
            lines = options
        if idx < 0:
            raise ItemError("bad_answer", f"field 'answer' {answer!r} is not one of its options {lines}")
        return stem, options, idx, extra

    def build(item_id, row):
        vid, dim, k, q = row
        if dim not in TEMPCOMPASS_QTYPES:
            raise ItemError("unknown_type", f"dimension {dim!r} is not one of {sorted(TEMPCOMPASS_QTYPES)}")
        stem, options, idx, extra = parse(q)
        clip = clips.get(root / f"{vid}.mp4")
        subject = ((meta_info.get(vid) or {}).get("eval_dim") or {}).get(dim) or {}
        target = subject.get("subject") if subject.get("subject") not in (None, "entire video") else None
        return _make_item(item_id=item_id, qtype=TEMPCOMPASS_QTYPES[dim], question=stem, options=options,
                          answer=idx, frames=clip.frames, target=target, source="tempcompass",
                          meta={"video_id": vid, "dimension": dim, "index": k, "task": task,
                                "reversed": vid.endswith("_reverse"), "timestamps": clip.timestamps.tolist(),
                                **extra})

    # Multi-choice ids keep their original form; the other tasks name theirs, so mixed loads stay unique.
    prefix = "tempcompass" if task == "multi_choice" else f"tempcompass/{task}"
    ids = ((f"{prefix}/{vid}/{dim}/{k}", (vid, dim, k, q)) for vid, dim, k, q in rows)
    return _collect("TempCompass" if task == "multi_choice" else f"TempCompass {task}", ids, build, on_missing, limit)


# ---------------------------------------------------------------------------- MVBench


def mvbench_task_name(name: str) -> str:
    """``"Fine-grained Action"`` / ``"fine_grained_action.json"`` -> ``"fine_grained_action"``."""
    key = re.sub(r"[\s\-]+", "_", Path(str(name)).stem.strip().lower())
    if key not in MVBENCH_TASKS:
        raise DataError(f"unknown MVBench task {key!r} (from {str(name)!r}); known: {', '.join(MVBENCH_TASKS)}. "
                        f"Name the file <task>.json or pass task=")
    return key


def load_mvbench(annotation_path, video_root, num_frames: int = 8, size=None, limit: int | None = None,
                 on_missing: str = "error", *, task: str | None = None, bound_mode: str = "crop",
                 frame_fps: float = FOLDER_FPS) -> LoadResult:
    """One MVBench task file (``json/<task>.json``); see the module doc."""
    if bound_mode not in ("crop", "support"):
        raise ConfigError(f"bound_mode must be 'crop' or 'support', got {bound_mode!r}")
    task = mvbench_task_name(task or annotation_path)
    qtype, folder, bounded = MVBENCH_TASKS[task]
    data = _read_json(annotation_path, list, "MVBench annotation")
    clips, root = _ClipCache(num_frames, size, frame_fps), Path(video_root)

    def build(item_id, indexed):
        index, row = indexed
        question, answer = str(_field(row, "question")), _field(row, "answer")
        candidates = _field(row, "candidates")
        if not isinstance(candidates, list) or len(candidates) < 2:
            raise ItemError("bad_options", f"field 'candidates' is {candidates!r}, not a list of 2+ options")
        options = [str(c) for c in candidates]
        if str(answer) not in options:
            raise ItemError("bad_answer", f"field 'answer' {answer!r} is not one of its candidates {options}")
        video = str(_field(row, "video"))
        tried = [root / folder / video, root / video]
        path = next((p for p in tried if p.exists()), None)
        if path is None:
            raise ItemError("missing_video", f"video {video!r} not found at {' or '.join(map(str, tried))}")
        bound = (_seconds(row, "start"), _seconds(row, "end")) if bounded else None
        support = None
        if bound is not None and bound_mode == "crop":
            clip = clips.get(path, *bound)
        else:
            clip = clips.get(path)
            support = segment_to_frames(*bound, clip.timestamps) if bound is not None else None
        return _make_item(item_id=item_id, qtype=qtype, question=question, options=options,
                          answer=options.index(str(answer)), frames=clip.frames, support=support,
                          source="mvbench", meta={"task": task, "video": video, "index": index,
                                                  "bound": bound, "timestamps": clip.timestamps.tolist()})

    rows = ((f"mvbench/{task}/{i}", (i, r)) for i, r in enumerate(data))
    return _collect(f"MVBench {task}", rows, build, on_missing, limit)


# ---------------------------------------------------------------------------- NExT-QA


def load_nextqa(annotation_path, video_root, num_frames: int = 8, size=None, limit: int | None = None,
                on_missing: str = "error", *, map_path=None, grounding_path=None) -> LoadResult:
    """NExT-QA (or NExT-GQA) multiple-choice CSV; see the module doc."""
    annotation_path = Path(annotation_path)
    if not annotation_path.is_file():
        raise DataError(f"NExT-QA annotation file {str(annotation_path)!r} does not exist")
    with open(annotation_path, newline="") as f:
        table = list(csv.DictReader(f))
        header = set(table[0]) if table else set()
    need = {"question", "answer", "qid", "type", "a0", "a1", "a2", "a3", "a4"}
    video_col = "video" if "video" in header else "video_id"
    missing = sorted(need - header) + ([] if video_col in header else ["video (or video_id)"])
    if missing:
        raise DataError(f"NExT-QA annotation file {str(annotation_path)!r} lacks column(s) {missing}; "
                        f"it has {sorted(header)}")
    if map_path is None and (annotation_path.parent / "map_vid_vidorID.json").is_file():
        map_path = annotation_path.parent / "map_vid_vidorID.json"  # the official layout keeps them together
    vid_map = _read_json(map_path, dict, "NExT-QA video map") if map_path is not None else None
    grounding = _read_json(grounding_path, dict, "NExT-GQA grounding") if grounding_path is not None else {}
    split = annotation_path.stem if annotation_path.stem in ("train", "val", "test") else "test"
    clips, root = _ClipCache(num_frames, size), Path(video_root)

    def build(item_id, row):
        vid, qid = str(_field(row, video_col)).strip(), str(_field(row, "qid")).strip()
        kind = str(_field(row, "type")).strip()
        if kind not in NEXTQA_QTYPES:
            raise ItemError("unknown_type", f"field 'type' {kind!r} is not one of {sorted(NEXTQA_QTYPES)}")
        question = str(_field(row, "question"))
        options = [str(_field(row, f"a{i}")).strip() for i in range(5)]
        answer = str(_field(row, "answer")).strip()
        # NExT-QA gives the index, NExT-GQA the text; an index is read first.
        if answer.isdigit() and int(answer) < len(options):
            idx = int(answer)
        elif answer in options:
            idx = options.index(answer)
        else:
            raise ItemError("bad_answer", f"field 'answer' {answer!r} is neither an index 0-4 nor one of {options}")
        if vid_map is not None and vid not in vid_map:
            raise ItemError("missing_video", f"video {vid!r} is not in the video map {str(map_path)!r}")
        path = root / (vid_map[vid] if vid_map is not None else vid)
        path = path if path.suffix else path.with_name(path.name + ".mp4")
        clip = clips.get(path)
        segments = ((grounding.get(vid) or {}).get("location") or {}).get(qid)
        span = (min(s for s, _ in segments), max(e for _, e in segments)) if segments else None
        meta = {"video": vid, "qid": qid, "type": kind, "timestamps": clip.timestamps.tolist(), "support_s": span}
        meta.update({k: int(row[k]) for k in ("frame_count", "width", "height") if str(row.get(k, "")).isdigit()})
        return _make_item(item_id=item_id, qtype=NEXTQA_QTYPES[kind], question=question, options=options,
                          answer=idx, frames=clip.frames, split=split, source="nextqa", meta=meta,
                          support=segment_to_frames(*span, clip.timestamps) if span else None)

    rows = ((f"nextqa/{str(r.get(video_col, '')).strip()}_{str(r.get('qid', '')).strip()}", r) for r in table)
    return _collect("NExT-QA", rows, build, on_missing, limit)


# ---------------------------------------------------------------------------- registry

LOADERS: dict[str, Callable[..., LoadResult]] = {
    "tempcompass": load_tempcompass,
    "mvbench": load_mvbench,
    "nextqa": load_nextqa,
}


def load_real(name: str, **kwargs: Any) -> LoadResult:
    """``LOADERS[name](**kwargs)`` with an error listing the known names."""
    if name not in LOADERS:
        raise RegistryError(f"unknown real video-QA source {name!r}; known: {', '.join(sorted(LOADERS))}")
    return LOADERS[name](**kwargs)
