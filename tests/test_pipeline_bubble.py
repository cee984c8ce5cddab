"""The pipeline bubble's formulas (elastic/train/pipeline_bubble.py), the report's per-stage rows
(elastic/report/pipeline_section.py) and the bottleneck's pipeline_bubble class, on hand-made
records. The measurement in a real PP 2 run is held in tests/test_parallel_layouts.py."""

import pytest

from elastic.report.bottleneck import THRESHOLDS, diagnose, measures
from elastic.report.pipeline_section import pipeline_rows
from elastic.train.pipeline_bubble import bubble_theory


@pytest.mark.parametrize("schedule,pp,m,v,want", [
    ("gpipe", 2, 2, 1, 1 / 3), ("1f1b", 2, 8, 1, 1 / 9), ("1f1b", 4, 4, 1, 3 / 7),
    ("interleaved_1f1b", 2, 2, 2, 1 / 5), ("looped_bfs", 2, 4, 2, 1 / 9), ("interleaved_zero_bubble", 4, 8, 2, 3 / 19),
    ("1f1b", 2, 4, 2, 1 / 5),  # one stage per rank: virtual stages do not apply
])
def test_bubble_theory_is_megatrons_formula(schedule, pp, m, v, want):
    assert bubble_theory(schedule, pp, m, v) == pytest.approx(want)


def _rec(step, busy, pipe, mem, step_s=1.0, warmup=False):
    idle = sum(p - b for b, p in zip(busy, pipe)) / len(busy)
    r = {"step": step, "step_s": step_s, "pipeline_s": pipe[0], "optimizer_s": 0.05, "pp_stage_busy_s": busy,
         "pp_stage_pipeline_s": pipe, "pp_stage_mem_gib": mem, "pp_idle_s": idle, "pp_schedule": "1f1b",
         "pp_microbatches": 2, "pp_virtual_stages": 1, "pp_bubble_theory": 1 / 3,
         "pp_bubble": sum(1 - b / p for b, p in zip(busy, pipe)) / len(busy), "tokens": 100, "loss": 2.0}
    return {**r, "warmup": True} if warmup else r


def test_rows_are_sums_over_steps_per_stage():
    recs = [_rec(1, [0.5, 0.4], [0.8, 0.8], [1.0, 1.5]), _rec(2, [0.3, 0.2], [0.6, 0.6], [1.2, 1.4])]
    rows = pipeline_rows(recs)
    assert [r["stages"] for r in rows] == [[0], [1]]
    assert rows[0]["busy_s"] == pytest.approx(0.4) and rows[0]["pipeline_s"] == pytest.approx(0.7)
    assert rows[0]["bubble"] == pytest.approx(1 - 0.8 / 1.4) and rows[1]["bubble"] == pytest.approx(1 - 0.6 / 1.4)
    assert rows[0]["mem_gib"] == 1.2 and rows[1]["mem_gib"] == 1.5
    assert [r["stages"] for r in pipeline_rows(recs, virtual=2)] == [[0, 2], [1, 3]]
    assert pipeline_rows([{"step": 1, "step_s": 1.0}]) == []


def test_a_large_bubble_is_named_with_its_lever():
    # idle 0.4 of a 1 s step on both stages: 40% of step time, over the 15% threshold
    recs = [_rec(1, [0.1, 0.1], [0.9, 0.9], [1, 1], warmup=True)] + [_rec(s, [0.5, 0.5], [0.9, 0.9], [1, 1]) for s in range(2, 6)]
    d = diagnose(recs, [], None, {"parallel": {"pp_microbatches": 2, "pp": 2}}, device="cpu")
    assert d.name == "pipeline_bubble" and d.score == pytest.approx(0.4)
    assert "parallel.pp_microbatches (now 2)" in d.lever and "theory 0.333" in d.evidence
    assert d.figures["compute_share"] == pytest.approx(0.9 - 0.4 + 0.05)
    row = next(m for m in measures(d) if m["class"] == "pipeline_bubble")
    assert row["finding"] and row["threshold"] == THRESHOLDS["pipeline_bubble"]
    small = [_rec(s, [0.85, 0.85], [0.9, 0.9], [1, 1]) for s in range(1, 6)]
    assert diagnose(small, [], None, None, device="cpu").name != "pipeline_bubble"
