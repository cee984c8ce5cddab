"""The curation `perplexity` stage (elastic/launch/curate_scorer.py): document perplexities under
a tiny random-init Hugging Face Llama (built here, nothing downloaded) match a reference computed
with `transformers` on the same documents (exp of the mean token NLL; a document longer than the
model's 128-token window in disjoint windows), and in the job the threshold removes exactly the
documents above it, with reason "perplexity", the score kept as the output's `perplexity` column."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
import torch

from elastic.config.schema import CurateSection
from tests.curate_helpers import prose
from tests.hf_helpers import make_hf_dir

MAX_LEN = 128  # the tiny model's max_position_embeddings

DOCS = {f"d{i}": prose(i, sentences=2 + i % 3) for i in range(7)}
DOCS["code"] = "def f(x):\n    return x + 1\n" * 3
DOCS["words"] = "alpha beta gamma delta elastic ray torch shard " * 4
DOCS["long"] = prose(99, sentences=30)  # several windows


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppl-llama")
    make_hf_dir(path, "llama", seed=3)
    return str(path)


def reference(hf_dir, texts):
    """transformers' LlamaForCausalLM, token by token: each window's input is at most MAX_LEN
    tokens; the first is [prefix] + tokens, later ones predict the next MAX_LEN tokens after
    the MAX_LEN tokens before them (lm-eval's disjoint rolling windows)."""
    import transformers

    from elastic.eval.evaluate import TokenizerView

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    prefix = TokenizerView.from_file(os.path.join(hf_dir, "tokenizer.json")).prefix_id
    out = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        nll, done = 0.0, 0
        while done < len(ids):
            end = min(len(ids), done + MAX_LEN)
            inp = ([prefix] + ids)[max(0, end - MAX_LEN):end]  # predicts ids[end - len(inp):end]
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([inp])).logits[0].double(), -1)
            tgt = ids[end - len(inp):end]
            n = end - done
            nll -= sum(lp[j, tgt[j]].item() for j in range(len(inp) - n, len(inp)))
            done = end
        out.append(math.exp(nll / len(ids)))
    return out


@pytest.fixture(scope="module")
def ref(hf_dir):
    return dict(zip(DOCS, reference(hf_dir, list(DOCS.values()))))


def test_scores_match_transformers(hf_dir, ref):
    from elastic.launch.curate_scorer import DocScorer

    sc = DocScorer(hf_dir, use_gpu=False, token_budget=300)  # several batches
    assert sc.max_len == MAX_LEN and len(sc.tok.encode_plain(DOCS["long"])) > 2 * MAX_LEN
    got = dict(zip(DOCS, sc(list(DOCS.values()))))
    for k in DOCS:
        assert got[k] == pytest.approx(ref[k], rel=1e-4), k
    assert len({round(v, 6) for v in got.values()}) == len(got)  # distinct: a threshold splits them


def test_threshold_in_the_job(ray_local, hf_dir, ref, tmp_path):
    import pyarrow.parquet as pq

    from elastic.launch.curate import read_curated, run_curation

    src = tmp_path / "in"
    src.mkdir()
    with open(src / "docs.jsonl", "w") as f:
        for k, v in DOCS.items():
            f.write(json.dumps({"id": k, "text": v}) + "\n")
    v = sorted(ref.values())
    cut = (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2  # half above it, no document near it
    cs = dataclasses.replace(CurateSection(), source=str(src), output=str(tmp_path / "out"), glob="*.jsonl",
                             stages=["perplexity"], perplexity_model=hf_dir, perplexity_max=cut, workers=1)
    res = run_curation(cs, say=lambda s: None)
    above = {k for k, v in ref.items() if v > cut}
    assert above and len(above) < len(ref)
    kept = read_curated(res.data_dir).to_pylist()
    assert [r["id"] for r in kept] == [k for k in DOCS if k not in above]  # input order
    for r in kept:
        assert r["perplexity"] == pytest.approx(ref[r["id"]], rel=1e-4)
    rdir = os.path.join(res.output, "removed")
    removed = [r for p in sorted(os.listdir(rdir)) for r in pq.read_table(os.path.join(rdir, p)).to_pylist()]
    assert {r["id"]: r["reason"] for r in removed} == {k: "perplexity" for k in above}
    assert all(r["perplexity"] > cut for r in removed)
    rep = res.report
    assert rep["removed_by_reason"] == {"perplexity": len(above)} and rep["docs_out"] == len(DOCS) - len(above)


def test_config_errors(tmp_path):
    from elastic.config import ConfigError
    from elastic.launch.curate import run_curation

    cs = dataclasses.replace(CurateSection(), stages=["perplexity"], output=str(tmp_path / "o"))
    with pytest.raises(ConfigError, match="curate.perplexity_model"):
        run_curation(cs, say=lambda s: None)
    with pytest.raises(ConfigError, match="curate.perplexity_model"):
        run_curation(dataclasses.replace(cs, perplexity_model=str(tmp_path)), say=lambda s: None)
