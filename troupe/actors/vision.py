"""The vision path: a tiny Qwen2.5-VL-style model built from a config, and video preprocessing
in Qwen2.5-VL's own patch layout with numpy and Pillow (the transformers video processor needs
torchvision, which cannot be installed here).

A row's video reaches the model as three things:

* the prompt: ``<|vision_start|>`` + ``<|video_pad|>`` × (t·h·w / merge²) + ``<|vision_end|>``
  before the row's text in the user turn, as Qwen2.5-VL's chat template places a video;
* ``pixel_values_videos`` ``[N, 3·tp·p·p]``: the normalised frames cut into ``tp``-frame ×
  ``p``×``p`` patches, merge-blocks contiguous (the order the model's patch merger expects);
* ``video_grid_thw`` ``(t, h, w)``: the patch grid (frames / tp, height / p, width / p).

In a `Batch` a video batch is ``pixel_values_videos`` ``[B, N_max, D]`` (each row's patches,
right-padded with zeros, so rows of other sizes still stack and `Batch.concat` pads them
like any other field) and ``video_grid_thw`` ``[B, 3]``; row i uses its first
``prod(video_grid_thw[i])`` patches, and a row without a video has grid ``(0, 0, 0)``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from troupe.actors.models import TinyLMSpec, save_model
from troupe.platform.errors import ConfigError, DataError

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
VIDEO_TOKEN_TYPE = 2  # mm_token_type_ids: text 0, image 1, video 2
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # Qwen2.5-VL normalises as CLIP does
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclasses.dataclass
class TinyVLSpec(TinyLMSpec):
    """Shape of the tiny Qwen2.5-VL-style model (about 190k parameters): the text side of
    `TinyLMSpec`, a small vision tower, and the frame size. At the defaults a 56×56 frame pair
    is 4×4 patches of 14×14 px, merged 2×2 into 4 tokens, so an 8-frame video is 16 tokens."""

    vision_depth: int = 1
    vision_hidden_size: int = 32
    vision_heads: int = 2
    vision_intermediate_size: int = 64
    patch_size: int = 14
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    # Frames are resized (aspect kept) to this many pixels, sides multiples of patch × merge.
    min_pixels: int = 56 * 56
    max_pixels: int = 56 * 56

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vision_heads < 1 or self.vision_hidden_size % self.vision_heads or \
                (self.vision_hidden_size // self.vision_heads) % 4:
            raise ConfigError(f"model.tiny_vl.vision_hidden_size={self.vision_hidden_size} must split into "
                              f"vision_heads={self.vision_heads} heads of a size divisible by 4 (2-D rotary)")
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ConfigError(f"model.tiny_vl: need 0 < min_pixels <= max_pixels, got {self.min_pixels}, "
                              f"{self.max_pixels}")

    def layout(self) -> VideoLayout:
        return VideoLayout(self.patch_size, self.temporal_patch_size, self.spatial_merge_size,
                           self.min_pixels, self.max_pixels)


@dataclasses.dataclass
class VideoLayout:
    """How frames become patches. troupe stores it in the model config (``troupe_video``), so
    every saved copy of the model, the learner's included, preprocesses the same way."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 28 * 28  # Qwen2.5-VL's video defaults, for checkpoints troupe did not build
    max_pixels: int = 768 * 28 * 28
    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD

    def __post_init__(self) -> None:
        self.mean, self.std = tuple(self.mean), tuple(self.std)  # lists after a trip through JSON

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def of(cls, config: Any, path: str | Path | None = None) -> VideoLayout:
        """The layout of a loaded VL model: troupe's own, else the checkpoint's preprocessor
        files (a local directory), else Qwen2.5-VL's defaults with the model's patch sizes."""
        stored = getattr(config, "troupe_video", None)
        if stored:
            return cls(**stored)
        v = config.vision_config
        return cls(v.patch_size, v.temporal_patch_size, v.spatial_merge_size, **_preprocessor_settings(path))


def _preprocessor_settings(path: str | Path | None) -> dict[str, Any]:
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        f = Path(path).expanduser() / name if path else None
        if f is not None and f.is_file():
            cfg = json.loads(f.read_text())
            size = cfg.get("size") or {}
            out = {"min_pixels": cfg.get("min_pixels") or size.get("shortest_edge"),
                   "max_pixels": cfg.get("max_pixels") or size.get("longest_edge"),
                   "mean": cfg.get("image_mean"), "std": cfg.get("image_std")}
            return {k: v for k, v in out.items() if v is not None}
    return {}


def is_vision_model(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None and getattr(config, "video_token_id", None) is not None


def vision_token_ids(tokenizer: Any) -> list[int]:
    """Ids of the vision markup tokens the tokenizer holds (Qwen2.5-VL's ``<|vision_pad|>`` too):
    placeholders for frames, never valid output."""
    vocab = tokenizer.get_vocab()
    return sorted({vocab[t] for t in (*VISION_TOKENS, "<|vision_pad|>") if t in vocab})


def save_hub_format(model: Any, tokenizer: Any, path: str | Path, layout: VideoLayout) -> Path:
    """Save a troupe-built VL model as a hub Qwen2.5-VL checkpoint is laid out: no
    ``troupe_video`` in config.json, the frame layout in ``preprocessor_config.json``. Lets a
    tiny model stand in for a hub checkpoint (a GPU preset's path through the loaders)."""
    path = Path(path)
    save_model(model, tokenizer, path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("troupe_video", None)
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    (path / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": layout.patch_size,
         "temporal_patch_size": layout.temporal_patch_size, "merge_size": layout.merge_size,
         "min_pixels": layout.min_pixels, "max_pixels": layout.max_pixels,
         "image_mean": list(layout.mean), "image_std": list(layout.std)}, indent=1))
    return path


# -- model ----------------------------------------------------------------------------------------
def build_tiny_vl(spec: TinyVLSpec, tokenizer: Any, seed: int = 0) -> Any:
    """A randomly initialised Qwen2.5-VL-style model sized by ``spec``; ``tokenizer`` must hold
    the vision tokens (`train_tokenizer(..., special_tokens=VISION_TOKENS)`)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ConfigError(f"the tokenizer lacks the vision tokens {missing}; train it with special_tokens=VISION_TOKENS")
    half = spec.hidden_size // spec.num_heads // 2
    # 3-D rotary: the rotary frequencies split among time, height and width as in Qwen2.5-VL (16:24:24).
    t = half // 4
    h = (half - t) // 2
    mrope = [t, h, half - t - h]
    text = dict(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": mrope},
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    vision = dict(
        depth=spec.vision_depth, hidden_size=spec.vision_hidden_size, num_heads=spec.vision_heads,
        intermediate_size=spec.vision_intermediate_size, out_hidden_size=spec.hidden_size,
        patch_size=spec.patch_size, temporal_patch_size=spec.temporal_patch_size,
        spatial_merge_size=spec.spatial_merge_size, tokens_per_second=2,
        # every block attends over the whole frame pair: windows only pay off on large frames
        fullatt_block_indexes=list(range(spec.vision_depth)),
        window_size=spec.patch_size * spec.spatial_merge_size * 4,
    )
    cfg = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=True,
        image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START], vision_end_token_id=ids[VISION_END],
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    cfg.troupe_video = dataclasses.asdict(spec.layout())
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model


# -- preprocessing --------------------------------------------------------------------------------
def resized_shape(height: int, width: int, layout: VideoLayout) -> tuple[int, int]:
    """Qwen2-VL's ``smart_resize``: sides multiples of ``factor``, area within the pixel bounds,
    aspect ratio kept as closely as possible."""
    f = layout.factor
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > layout.max_pixels:
        beta = math.sqrt(height * width / layout.max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < layout.min_pixels:
        beta = math.sqrt(layout.min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def video_patches(frames: Any, layout: VideoLayout) -> tuple[np.ndarray, tuple[int, int, int]]:
    """``uint8 [F, H, W, 3]`` frames → (``float32 [t·h·w, 3·tp·p·p]`` patches, ``(t, h, w)``)."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
        raise DataError(f"frames must be a uint8 array [F, H, W, 3] with F >= 1; got {frames.dtype} "
                        f"{tuple(frames.shape)}")
    H, W = resized_shape(frames.shape[1], frames.shape[2], layout)
    if (H, W) != frames.shape[1:3]:
        from PIL import Image

        frames = np.stack([np.asarray(Image.fromarray(f).resize((W, H), Image.BICUBIC)) for f in frames])
    x = (frames.astype(np.float32) / 255.0 - np.float32(layout.mean)) / np.float32(layout.std)
    tp, p, m = layout.temporal_patch_size, layout.patch_size, layout.merge_size
    if pad := -len(x) % tp:  # as the Qwen processor does: repeat the last frame
        x = np.concatenate([x, np.repeat(x[-1:], pad, 0)])
    t, h, w = len(x) // tp, H // p, W // p
    x = x.transpose(0, 3, 1, 2).reshape(t, tp, 3, h // m, m, p, w // m, m, p)
    # → [t, h/m, w/m, m, m, C, tp, p, p]: patches of one merge block adjacent, channels-time-space inside
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(t * h * w, 3 * tp * p * p)), (t, h, w)


def video_placeholder(grid: tuple[int, int, int], layout: VideoLayout) -> str:
    """The prompt text standing for a video: one ``<|video_pad|>`` per merged token."""
    t, h, w = grid
    return VISION_START + VIDEO_PAD * (t * h * w // layout.merge_size**2) + VISION_END


def video_prompts(prompts: list[str], frames: list[Any], layout: VideoLayout) -> tuple[list[str], dict[str, Any]]:
    """The prompts with each row's video placeholder in front, and the Batch's video tensors:
    ``pixel_values_videos`` ``[B, N_max, D]`` (zero right-padded) and ``video_grid_thw``
    ``[B, 3]``. A row whose frames are None gets no placeholder and grid ``(0, 0, 0)``."""
    import torch

    texts, patches, grids = [], [], []
    for i, (prompt, f) in enumerate(zip(prompts, frames, strict=True)):
        if f is None:
            texts.append(prompt)
            patches.append(None)
            grids.append((0, 0, 0))
            continue
        try:
            x, grid = video_patches(f, layout)
        except DataError as e:
            raise DataError(f"row {i}: {e}") from None
        texts.append(video_placeholder(grid, layout) + prompt)
        patches.append(x)
        grids.append(grid)
    dim = 3 * layout.temporal_patch_size * layout.patch_size**2
    width = max((len(x) for x in patches if x is not None), default=0)
    pv = torch.zeros(len(prompts), width, dim)
    for i, x in enumerate(patches):
        if x is not None:
            pv[i, : len(x)] = torch.from_numpy(x)
    return texts, {"pixel_values_videos": pv, "video_grid_thw": torch.tensor(grids, dtype=torch.long)}


# -- model inputs ---------------------------------------------------------------------------------
def video_inputs(config: Any, input_ids: Any, pixel_values_videos: Any, video_grid_thw: Any) -> dict[str, Any]:
    """The VL model's video arguments for a batch: the patches of the rows with a video,
    concatenated in row order (the order the model fills ``<|video_pad|>`` tokens), their grids,
    and ``mm_token_type_ids`` (without it Qwen2.5-VL silently drops its 3-D rotary positions).

    Pass no ``position_ids`` with these: the model numbers prompt and completion itself (3-D
    for the video, left padding skipped), exactly as ``generate`` does step by step."""
    import torch

    n = video_grid_thw.prod(-1)
    if not bool((n > 0).any()):
        return {}
    keep = torch.arange(pixel_values_videos.shape[1], device=n.device)[None] < n[:, None]
    types = (input_ids == config.video_token_id).long() * VIDEO_TOKEN_TYPE
    grids = video_grid_thw[n > 0]
    # One time step per temporal grid for every video, passed explicitly: left out, the model
    # draws its default from an iterator as long as the *sequence*, which runs dry (StopIteration)
    # in a batch holding more videos than tokens per row.
    return {"pixel_values_videos": pixel_values_videos[keep], "video_grid_thw": grids,
            "second_per_grid_ts": torch.ones(len(grids), device=grids.device), "mm_token_type_ids": types}
