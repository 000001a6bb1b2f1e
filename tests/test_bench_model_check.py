"""benchmarks/model_check.py over the H200's committed weight-gradient sweep: the tile model's picks against the
tiles timed, a guard for changes to runtime/tile_model.py (no GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import model_check  # noqa: E402

WEIGHT_SWEEP = [BENCHMARKS / "measured" / f"2026-12-01-h200-08b2fc4-weight-{part}.json" for part in ("sweep", "pairs")]


def test_the_weight_gradient_picks_stay_among_the_fastest_tiles_timed() -> None:
    """Every pick of the 16 swept weight-gradient stages was timed; on average 1.5% behind each stage's fastest
    tile when the rule of 10b2b72 was fitted (4.4% with the rule before it), at worst 17.7% (1-D 32->32: t1x4
    picked, t2x4 fastest)."""
    summary = model_check.check(model_check.timed_tiles(WEIGHT_SWEEP))
    assert len(summary.checks) == 16 and len(summary.timed) == 16
    assert summary.mean_regret <= 1.02
    assert summary.worst_regret <= 1.18
    assert summary.log_error_sd <= 0.16
    by_case = {check.stage[0]: check for check in summary.checks}
    assert by_case["conv2d_128_128_n8"].regret == 1.0 and by_case["sweep_3d_48_24_n8"].regret == 1.0


def test_a_pick_that_was_not_timed_is_reported_as_such(tmp_path) -> None:
    row = {"case": "conv2d_64_56_n32", "stage": "backward_weight", "bm": 32, "bn": 32, "bk": 16, "tm": 4, "tn": 4,
           "split": 1, "packed": False, "us": 999.0}
    sweep = tmp_path / "one.json"
    sweep.write_text(json.dumps([row]))
    (only,) = model_check.check(model_check.timed_tiles([sweep])).checks
    assert only.pick_us is None and only.regret is None
    assert only.fastest == (32, 32, 16, 4, 4, 1, False) and only.fastest_us == 999.0


DEPTH_SWEEP = [BENCHMARKS / "measured" / name for name in ("2026-12-01-h200-fba8cae-depth-sweep.json",
                                                           "2026-12-02-h200-42c62c5-depth-pairs.json")]


def test_the_conv_stage_picks_at_both_slice_depths_were_timed():
    """The forward and input-gradient picks of the batched benchmark cases and calibration shapes where wide
    slices were timed (20 stages): every pick timed, on average within 1% of the fastest tile there, at worst
    2.8% (conv2d N8 128->128: 128x128 at 32 channels picked, 64x128 fastest)."""
    summary = model_check.check(model_check.timed_tiles(DEPTH_SWEEP))
    assert len(summary.checks) == 20 and len(summary.timed) == 20
    assert summary.mean_regret <= 1.01
    assert summary.worst_regret <= 1.03
