"""Evaluation on a real run: eval.tasks on the live FSDP model (2 workers over gloo) equals
jobs/eval.py on the saved checkpoint; jobs/eval.py on Ray shards, resumes without recomputing,
scores code in the sandbox, plots metric vs step and reports contamination; bad task lists
stop before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.config import ConfigError, load_config
from tests.helpers import make_text_corpus, read_jsonl, small_run_overrides

REPO = Path(__file__).resolve().parents[1]
STEPS = 4


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, ray_local):
    from elastic.launch.pretrain import run_pretraining

    tmp = tmp_path_factory.mktemp("evalrun")
    corpus = make_text_corpus(tmp / "corpus", n_docs=60)
    over = small_run_overrides(tmp / "runs", "r", corpus, STEPS, **{
        "eval.every_steps": 2, "eval.tasks": "[heldout_text, hellaswag]", "eval.task_limit": 6,
        "checkpoint.keep_last": 3})
    run_pretraining(load_config(None, over), progress=False)
    return tmp / "runs" / "r"


def test_in_training_eval_equals_eval_of_the_checkpoint(run_dir):
    """The live-model numbers at the last step (items split over 2 ranks, FSDP) equal the
    evaluation of the checkpoint saved at that step, in one process."""
    from elastic.eval.evaluate import ItemEvaluator, TokenizerView
    from elastic.launch.eval import load_task
    from elastic.eval.metrics import aggregate
    from elastic.model.hf import from_pretrained

    recs = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "step" in r]
    evals = [r for r in recs if "eval/heldout_text/bits_per_byte" in r]
    assert [r["step"] for r in evals] == [2, 4]
    last = evals[-1]
    step_dir = run_dir / f"step_{STEPS:08d}"
    model = from_pretrained(str(step_dir)).eval()
    ev = ItemEvaluator(model, TokenizerView.from_file(str(run_dir / "tokenizer.json")), 64)  # data.seq_len
    for task, metric in (("heldout_text", "bits_per_byte"), ("hellaswag", "acc_norm")):
        td = load_task(task, 6)
        got = aggregate(td.spec, ev.run(td.spec, [(i, d, c) for i, (d, c) in enumerate(zip(td.docs, td.contexts))]))
        # seq 64 with a 300-token vocabulary: some HellaSwag endings do not fit and are counted
        assert last[f"eval/{task}/n"] + last.get(f"eval/{task}/skipped", 0) == 6
        assert last[f"eval/{task}/n"] == got["n"] and last.get(f"eval/{task}/skipped", 0) == got.get("skipped", 0)
        assert last[f"eval/{task}/{metric}"] == pytest.approx(got[metric], rel=1e-5, abs=1e-6)
    report = (run_dir / "report.md").read_text()
    assert "## Evaluation (eval.tasks" in report and "heldout_text/bits_per_byte" in report
    assert (run_dir / "plots" / "eval.png").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["evaluation"]["heldout_text/bits_per_byte"]["last_step"] == STEPS


def test_jobs_eval_shards_resumes_scores_code_and_plots(run_dir, tmp_path):
    from elastic.launch.eval import EvalRequest, contamination_report, run_eval

    out = tmp_path / "out"
    lines = []
    req = EvalRequest(models=[str(run_dir)], tasks=["heldout_text", "arc_easy", "gsm8k", "humaneval"], out_dir=str(out),
                      limit=4, workers=2, unit_items=3)
    res = run_eval(req, say=lines.append)
    labels = [m.label for m in res.models]
    assert labels == ["step_00000002", "step_00000004"]
    assert res.computed_items == 2 * 4 * 4 and res.reused_items == 0
    doc = json.loads((out / "eval.json").read_text())
    for lab in labels:
        m = doc["metrics"][lab]
        assert m["arc_easy"]["n"] == 4 and 0 <= m["arc_easy"]["acc_norm"] <= 1
        assert m["heldout_text"]["bits_per_byte"] > 0
        assert "pass@1" in m["humaneval"] and "exact_match" in m["gsm8k"]
        code = doc["items"][lab]["humaneval"]
        assert len(code) == 4 and all(len(r["verdicts"]) == 1 and r["verdicts"][0] != "sandbox_error" for r in code)
        assert [r["index"] for r in doc["items"][lab]["arc_easy"]] == [0, 1, 2, 3]
    assert res.plots and Path(res.plots[0]).is_file()
    table = [ln for ln in lines if ln.startswith("heldout_text")]
    assert len(table) == 1 and "bits_per_byte" in table[0]
    # a crash after some items: the rest is computed, nothing is recomputed
    items = out / "step_00000004" / "arc_easy.items.jsonl"
    kept = items.read_text().splitlines()[:2]
    items.write_text("\n".join(kept) + "\n{\"torn")  # two records and a torn last line
    res2 = run_eval(req, say=lambda s: None)
    assert res2.computed_items == 2 and res2.reused_items == 2 * 4 * 4 - 2
    assert res2.metrics == res.metrics
    lines = contamination_report(str(run_dir), res2)
    assert any("arc_easy" in ln for ln in lines) and (out / "contamination.json").is_file()


def test_eval_config_errors_stop_before_any_work(tmp_path):
    from elastic.launch.pretrain import run_pretraining

    corpus = make_text_corpus(tmp_path / "c", n_docs=10)
    for tasks, msg in (("[gsm8k]", "gsm8k is a generation task"), ("[no_such_task]", "no_such_task: no such task")):
        cfg = load_config(None, small_run_overrides(tmp_path / "runs", "bad", corpus, 2,
                                                    **{"eval.every_steps": 1, "eval.tasks": tasks}))
        with pytest.raises(ConfigError, match=msg):
            run_pretraining(cfg, progress=False)
    r = subprocess.run([sys.executable, str(REPO / "jobs" / "eval.py"), "--model", str(tmp_path), "--tasks", "hellaswag"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a run directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "t.yaml"
    bad.write_text("task: t\ntype: multiple_choice\ndata: x.jsonl\nnum_fewshots: 1\n")
    r = subprocess.run([sys.executable, str(REPO / "jobs" / "eval.py"), "--model", str(tmp_path), "--tasks", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown key 'num_fewshots'" in r.stderr
