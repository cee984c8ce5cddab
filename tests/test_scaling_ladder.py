"""The smoke ladder end to end on a real local Ray cluster: 2 sizes x 2 token counts of ordinary
pretraining runs (two at a time), fit.json and plots written, a second invocation re-runs no
finished cell; bad ladder configs stop with one line before any run starts."""

from __future__ import annotations

import io
import json
import os

import pytest

from elastic.config import ConfigError
from tests.helpers import make_text_corpus, read_jsonl


def _overrides(tmp, corpus):
    return [f"run.storage_path={tmp / 'runs'}", f"data.source={corpus}", "data.glob=**/*.txt",
            "data.shard_mb=0.004", "eval.fraction=0.2",
            # two cells at once on the fixture's 4 CPUs: each holds 0.5 (worker) + 2 x 0.5 (data actors)
            "ladder.concurrent=2", "scaling.cpus_per_worker=0.5", "data.tokenize_cpus=0.5"]


@pytest.fixture(scope="module")
def ladder(tmp_path_factory, ray_local):
    from elastic.launch.ladder import run_ladder

    tmp = tmp_path_factory.mktemp("ladder")
    corpus = make_text_corpus(tmp / "corpus", n_docs=80)
    over = _overrides(tmp, corpus)
    out = io.StringIO()
    first = run_ladder(None, over, smoke=True, out=out)
    return tmp, over, first, out.getvalue()


def test_smoke_ladder_runs_fits_and_plots(ladder):
    tmp, _, res, console = ladder
    d = tmp / "runs" / "ladder-smoke"
    assert res.dir == str(d) and not res.failed, console
    assert len(res.ran) == 4 and not res.skipped
    cells = {p.stem: json.loads(p.read_text()) for p in (d / "cells").glob("*.json")}
    assert len(cells) == 4
    for name, c in cells.items():
        assert c["val_loss"] > 0 and c["N"] > 0 and c["D"] == c["steps"] * c["batch"] * 64
        assert c["C"] == pytest.approx(c["flops_per_token"] * c["D"])
        # each cell is an ordinary run with its own run directory and metrics, evaluated at its last step
        recs = read_jsonl(os.path.join(c["run_dir"], "metrics.jsonl"))
        assert recs[-1]["step"] == c["steps"] and recs[-1]["val_loss"] == c["val_loss"]
    # one tokenizer for every cell (losses in the same units)
    toks = {json.loads(open(os.path.join(c["run_dir"], "config.json")).read())["data"]["tokenizer"] for c in cells.values()}
    assert toks == {str(d / "tokenizer.json")}
    fit = json.loads((d / "fit.json").read_text())
    assert set(fit["approach3"]["constants"]) == {"E", "A", "B", "alpha", "beta"}
    assert set(fit["approach3"]["intervals"]) == {"E", "A", "B", "alpha", "beta"}
    assert fit["approach3"]["optimal"][0]["tokens_per_param"] > 0
    # grid mode holds out the largest size: its 2 cells are predicted from the other 2
    held = fit["heldout"]["cells"]
    assert len(held) == 2 and {h["name"] for h in held} == set(fit["cells"]["held_out"])
    assert all(h["predicted"] > 0 for h in held) and fit["heldout"]["mean_abs_rel_error"] >= 0
    for png in ("loss_vs_flops.png", "frontier.png", "predicted_vs_actual.png"):
        assert (d / "plots" / png).stat().st_size > 1000
    assert "[ladder] fit:" in console and "held out 2 cell(s)" in console
    starts = [e for e in read_jsonl(str(d / "ladder.jsonl")) if e["event"] == "cell_start"]
    assert len(starts) == 4


def test_second_invocation_reruns_nothing(ladder):
    from elastic.launch.ladder import run_ladder

    tmp, over, _, _ = ladder
    d = tmp / "runs" / "ladder-smoke"
    before = {p.name: p.read_text() for p in (d / "cells").glob("*.json")}
    n_events = len(read_jsonl(str(d / "ladder.jsonl")))
    res = run_ladder(None, over, smoke=True, out=io.StringIO())
    assert res.ran == [] and len(res.skipped) == 4 and not res.failed
    after = {p.name: p.read_text() for p in (d / "cells").glob("*.json")}
    assert after == before  # records (with their `finished` timestamps) untouched
    new = read_jsonl(str(d / "ladder.jsonl"))[n_events:]
    assert [e["event"] for e in new] == ["cell_skip"] * 4
    assert (d / "fit.json").exists()


@pytest.mark.parametrize("extra, msg", [
    (["ladder.sizes=[]"], "ladder.sizes: is empty"),
    (["ladder.sizes=[{dim: 30, n_layers: 1, n_heads: 4}]"], "ladder.sizes[0]: dim 30 is not divisible by n_heads 4"),
    (["ladder.tokens=[]"], "ladder.tokens: is empty"),
    (["ladder.mode=isoflop", "ladder.flops=[]"], "ladder.flops: is empty"),
    (["ladder.sizes=[{dim: 32, n_layers: 1}]"], "ladder.sizes[0]: needs n_heads"),
    (["ladder.holdout=2"], "ladder.holdout: must be in [0, 2)"),
])
def test_bad_ladder_config_is_one_line_before_any_run(tmp_path, capsys, extra, msg):
    from jobs.ladder import main

    code = main(["--smoke", "--set", f"run.storage_path={tmp_path}"] + [a for e in extra for a in ("--set", e)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("config error: ") and msg in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing created, nothing started


def test_changed_rule_under_same_name_is_refused(ladder):
    from elastic.launch.ladder import check_records, plan_ladder, read_cells

    tmp, over, _, _ = ladder
    plan = plan_ladder(None, over + ["train.lr=0.02"], smoke=True)
    with pytest.raises(ConfigError, match="recorded in .* with lr"):
        check_records(plan, read_cells(plan.dir))
