"""The GPU benchmarks also run on CPU in smoke mode, through the same code path (Ray Train +
Ray Data + FSDP2), and write the JSON their tables come from."""

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def _run(script, out, *extra, timeout=600):
    env = {**os.environ, "RAY_ADDRESS": "local", "WANDB_MODE": "disabled"}
    r = subprocess.run([sys.executable, str(REPO / "bench" / script), "--smoke", "--out", str(out), *extra],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout, json.loads(out.read_text())


def test_data_throughput_smoke(tmp_path):
    stdout, res = _run("data_throughput.py", tmp_path / "dt.json", "--cpus", "2")
    pc = res["per_core"]
    assert pc["store"]["tokens"] == pc["bare"]["tokens"] > 0  # the same documents, the same tokens
    assert pc["ratio_cpu"] > 0 and pc["trainer"]["cores_per_gpu"] > 0 and "cores/GPU" in stdout
    ws = res["world_sizes"]
    assert [w["world_size"] for w in ws] == [1, 2] and all(w["tokenize_cpu_s"] > 0 for w in ws)
    assert ws[0]["source"] == "cache build records" and all(w["builds"] >= 1 for w in ws)
    assert res["default_job"]["steps"] == 3 and 0 <= res["default_job"]["share_all"] < 1


def test_gpu_check_smoke(tmp_path):
    """The throughput part of the one-command GPU check at toy sizes on CPU: the training row
    beside the HF peer (the other parts run in test_gpu_check_within_smoke); it writes JSON and
    markdown and deletes its run directories."""
    stdout, res = _run("gpu_check.py", tmp_path / "gc.json", "--parts", "throughput", timeout=900)
    assert res["smoke"] and res["parts"] == ["throughput"]
    tp = res["throughput"]
    assert tp["returncode"] == 0 and tp["rows"][0]["tokens_per_s"] > 0 and tp["peers"][0]["tokens_per_s"] > 0
    # its smoke ran `bench/train_throughput.py --smoke` (CI's one run of that script): both
    # activation-checkpointing settings, steady steps and save stalls, the printed table and formula
    assert "MFU = flops_per_token" in tp["printed"] and "ckpt stall_s" in tp["printed"]
    assert [r["config"]["train.activation_checkpointing"] for r in tp["rows"]] == ["none", "full"]
    for r in tp["rows"]:
        # 5 steps: the warm-up, steady steps 2 and 4, saves at 3 (the run goes on past it) and 5 (final)
        assert r["steps_measured"] == 2 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1, r
        assert r["attention_backend"] == "sdpa_mask" and r["device"] == "cpu"
        assert [(c["step"], c["final"]) for c in r["checkpoints"]] == [(3, False), (5, True)], r["checkpoints"]
        assert all(c["stall_s"] is not None and c["stall_s"] >= 0 for c in r["checkpoints"])
    assert tp["args"]["storage"] and not os.path.exists(tp["args"]["storage"])  # what the sweep wrote is gone
    assert list(tp["best_ratio_vs_peer"].values())[0] > 0
    assert "Best of ours / best of the peer" in (tmp_path / "gc.md").read_text()


def test_gpu_check_within_smoke(tmp_path):
    """`--within 9 --smoke`: the short-window plan at toy sizes on CPU, in its order (GRPO first,
    then the 1b throughput vs the HF peer, 1b generation, the save stall, the slowdown runs, the
    rest as time allows), inside its 9 minutes, each part's JSON written as it finished."""
    import time

    from bench.gpu_within import PLAN

    t0 = time.time()
    stdout, res = _run("gpu_check.py", tmp_path / "gw.json", "--within", "9", timeout=600)
    assert time.time() - t0 < 9 * 60 and res["wall_s"] < 9 * 60
    assert res["plan"] == list(PLAN) and res["plan"][:4] == ["grpo", "throughput_1b", "generation_1b", "checkpoint_1b"]
    ran = res["parts"]
    assert ran[:4] == res["plan"][:4], ran  # the parts that matter most always fit
    for part in res["plan"]:  # each part ran, or says why not
        assert part in ran or isinstance(res[part].get("skipped"), str), (part, res[part])
    for part in ran:  # written the moment it finished
        assert json.loads((tmp_path / f"gw-{part}.json").read_text())["wall_s"] == res[part]["wall_s"]
    g = res["grpo"]
    assert g["returncode"] == 0 and g["sft"]["checkpoint"] and g["grpo"]["returncode"] == 0, g
    assert g["grpo"]["steps"] == 3 and g["grpo"]["device"] == "cpu" and not os.path.exists(g["grpo"]["run_dir"])
    tp = res["throughput_1b"]
    assert tp["returncode"] == 0 and tp["ours"]["tokens_per_s"] > 0 and tp["peer"]["tokens_per_s"] > 0
    assert tp["ratio_vs_peer"] == tp["ours"]["tokens_per_s"] / tp["peer"]["tokens_per_s"]
    assert res["generation_1b"]["returncode"] == 0 and res["generation_1b"]["results"]["results"]
    ck = res["checkpoint_1b"]
    assert ck["returncode"] == 0 and ck["async_stall_s"] >= 0 and any(c["final"] for c in ck["saves"])
    if "slowdown" in ran:
        sd = res["slowdown"]
        assert all(sd[k]["returncode"] == 0 for k in "ABCD" if "returncode" in sd[k]), sd
        assert sd["A"]["after_over_before"] > 0 and isinstance(sd["verdict"], str)
    if "jobs" in ran:
        for name in ("pretrain", "sft", "dpo"):
            job = res["jobs"][name]
            assert job.get("skipped") or (job["returncode"] == 0 and job["world_size"] == 1), (name, job)
    md = (tmp_path / "gw.md").read_text()
    assert "| grpo | ok |" in md and "| throughput_1b | ok |" in md


def test_verdict_names_the_suspect_whose_removal_removes_the_slowdown():
    from bench.gpu_within import slowdown_ratio, verdict

    assert verdict({"A": 0.6, "B": 1.0, "C": 0.6, "D": 1.0}).startswith("the evaluation (its torch.compile recompiles")
    assert verdict({"A": 0.6, "B": 1.0, "C": 0.6, "D": 0.6}).startswith("the evaluation (not compile")
    assert verdict({"A": 0.6, "B": 0.6, "C": 1.0, "D": 0.6}).startswith("the save at mid")
    assert verdict({"A": 1.0, "B": 1.0, "C": 1.0, "D": 1.0}).startswith("no slowdown")
    assert verdict({"A": None}).startswith("not measured")
    # steps 1..16, mid 8: before = steps 3..7, after = steps 11..15; eval and saving steps left out
    recs = [{"step": i, "tokens": 100, "step_s": 1.0 if i < 8 else 2.0} for i in range(1, 17)]
    recs[11]["eval_s"] = 5.0
    recs[12]["checkpoint_stall_s"] = 0.1
    r = slowdown_ratio(recs, 8, 16)
    assert (r["before_tok_s"], r["after_tok_s"], r["after_over_before"]) == (100.0, 50.0, 0.5)


def test_python_tests_throughput_smoke(tmp_path):
    """The python_tests bench runs its two variants (sandboxed, unsandboxed: the same harness)
    on a few HumanEval canonical solutions and writes the ratio its table quotes."""
    out = tmp_path / "pt.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "python_tests_throughput.py"), "--reps", "1",
                        "--limit", "8", "--parallel", "0", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["items"] == 8 and "overhead (sandboxed / unsandboxed per eval)" in r.stdout
    med = res["medians"]
    assert med["overhead_ratio"] == med["sandboxed_s_per_eval"] / med["unsandboxed_s_per_eval"] > 0
    assert res["layers"]["mount_namespace"] == "bwrap"


def test_eval_throughput_smoke(tmp_path):
    """The eval bench runs our evaluator and lm-eval's HF backend on the same tiny exported model
    and items (4 tasks, 8 items each), checks their numbers agree and writes a ratio per task."""
    import pytest

    pytest.importorskip("lm_eval")
    stdout, res = _run("eval_throughput.py", tmp_path / "ev.json", timeout=300)
    rows = {r["task"]: r for r in res["results"]}
    assert set(rows) == {"hellaswag", "arc_easy", "mmlu_elementary_mathematics", "heldout_text"}
    for name, r in rows.items():
        assert r["items"] == 8 and r["ratio"] > 0, (name, r)
        assert r["within_tol"], (name, r["max_abs_dll"])
        if name != "heldout_text":  # rolling perplexity sums hundreds of nats: lm-eval's float32 sum
            # drifts ~1e-4 (the bench's tolerance there is 1e-6 of |ll|, as tests/test_eval_parity.py)
            assert r["max_abs_dll"] < 1e-4, (name, r["max_abs_dll"])
    assert rows["hellaswag"]["ratio_no_share"] > 0 and rows["heldout_text"]["ratio_no_share"] is None
    assert res["all_within_tol"] and "max |Δll|" in stdout
    assert not os.path.exists(res["scratch"])  # the model, task files and datasets cache are gone


def test_curate_throughput_smoke(tmp_path):
    """The curation bench runs both pipelines (filters, MinHash dedup) for ours and datatrove on
    two corpora from 60 stdlib files (source, docstrings) plus planted copies, and writes the
    per-core ratio its table quotes."""
    import pytest

    pytest.importorskip("datatrove")
    stdout, res = _run("curate_throughput.py", tmp_path / "cu.json", timeout=300)
    rows = {(r["corpus"], r["pipeline"]): r for r in res["results"]}
    assert set(rows) == {(c, p) for c in ("source", "docstrings") for p in ("filters", "dedup")}
    assert "ratio = ours/datatrove" in stdout
    for r in rows.values():
        assert r["ours"]["docs_in"] == r["datatrove"]["docs_in"] > 30 and r["ratio_docs_per_cpu_s"] > 0
    # the planted exact copies are gone on both sides
    for c in ("source", "docstrings"):
        for side in ("ours", "datatrove"):
            d = rows[(c, "dedup")][side]
            assert d["docs_out"] <= d["docs_in"] - res["corpus"][c]["planted_exact"]


def test_trl_peer_smoke(tmp_path):
    """The TRL peer bench runs both sides of GRPO and SFT from one exported policy (trained here
    for a few steps), on the same prompts and token ids, and writes the ratios its table quotes;
    the smoke mode checks the plumbing, not the targets."""
    stdout, res = _run("trl_peer.py", tmp_path / "peer.json", "--parts", "grpo,sft", timeout=900)
    g, s = res["grpo"], res["sft"]
    assert g["step_ratio"] == g["trl"][0]["s_per_step"] / g["ours"][0]["s_per_step"] > 0
    assert g["trl"][0]["prompt_tokens_equal"] == 1.0  # TRL's tokenizer reads our prompts as our token ids
    assert g["ours"][0]["steps"] == g["trl"][0]["steps"] == 2
    best = max(s["unpacked"][0]["real_tokens_per_s"], s["packed"][0]["real_tokens_per_s"])
    assert s["tokens_ratio"] == s["ours"][0]["real_tokens_per_s"] / best > 0
    assert "GRPO s/step" in stdout and "SFT ratio vs TRL's best layout" in stdout
    assert any("sandbox" in m for m in res["mismatches"]) and res["context"]["trl"]


def test_rollout_buffer_stall_smoke(tmp_path):
    """bench/rollout_buffer_stall.py at toy sizes: both sides measured, the ratio its table quotes."""
    out = tmp_path / "rb.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "rollout_buffer_stall.py"), "--sizes", "8,32", "--tokens", "16",
                        "--reps", "1", "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [x["completions"] for x in rows] == [8, 32] and "ratio = table_stall_s / json_stall_s" in r.stdout
    for x in rows:
        assert x["ratio"] == x["table_stall_s"] / x["json_stall_s"] and x["parquet_mb"] > 0 and x["json_mb"] > 0


def test_pp_bubble_smoke(tmp_path):
    """bench/pp_bubble.py at toy sizes: every schedule measured on 2 gloo ranks, bubble and
    theory by their formulas."""
    out = tmp_path / "ppb.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "pp_bubble.py"), "--dim", "32", "--layers", "4", "--seq", "16",
                        "--micro", "2", "--reps", "1", "--out", str(out)], capture_output=True, text=True, timeout=180, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(x["schedule"], x["microbatches"]) for x in rows] == [("gpipe", 2), ("1f1b", 2), ("interleaved_1f1b", 2)]
    assert [x["theory"] for x in rows] == [1 / 3, 1 / 3, 1 / 5]
    for x in rows:
        assert x["step_s"] > 0 and all(b > 0 for b in x["busy_s"]) and x["speedup"] == x["unsplit_s"] / x["step_s"]
