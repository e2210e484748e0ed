"""Counterfactual video QA (ALGORITHMS.md §A): items, the synthetic environment, view operators
and pixel rendering. Numpy only at import time."""

from troupe.envs.video_qa.items import (  # noqa: F401
    ABST,
    ABSTAIN_OPTION,
    INVALID,
    QTYPES,
    TEMPORAL_QTYPES,
    SymbolicFrames,
    SymObject,
    VideoItem,
    parse_answer,
)
from troupe.envs.video_qa.pixels import render_frames, render_pixels, target_boxes  # noqa: F401
from troupe.envs.video_qa.synthetic import SYNTH_QTYPES, VideoQAConfig, VideoQATask, render_symbolic  # noqa: F401
from troupe.envs.video_qa.views import (  # noqa: F401
    DEFAULT_TABLE,
    LABELS,
    VIEWS,
    BehaviorTable,
    ViewUnavailable,
    apply_view,
    select_views,
    unavailable_field,
)
