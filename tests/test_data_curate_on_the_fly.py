"""data.curate: per-document curation stages run by the store builder's packer actors on each
shard before tokenization. German documents are dropped (counted by reason in builds.jsonl),
e-mail addresses never reach the tokens, English documents all do, and curated shards get
their own cache directory (the packing key covers the stages)."""

from __future__ import annotations

import pytest

from elastic.config import ConfigError, load_config
from elastic.data import prepare_data_plan
from elastic.data.store import ShardCache, packing_key
from elastic.data.tokenizer import from_json
from elastic.launch.data_plans import check_data_curate
from elastic.records import read_records
from tests.helpers import open_store, whole_epoch

EN = ("The committee published its annual report on regional water quality, describing how the new "
      "treatment plants reduced contamination in the northern rivers over the past three years. "
      "Residents can write to {mail} with questions about the measurements and the methods used.")
DE = ("Der Ausschuss hat seinen Jahresbericht zur Wasserqualität in der Region veröffentlicht und "
      "beschreibt, wie die neuen Kläranlagen die Verschmutzung der nördlichen Flüsse in den letzten "
      "drei Jahren verringert haben. Fragen zu den Messungen beantwortet das Büro gern.")


def _corpus(d):
    d.mkdir(parents=True)
    for i in range(12):
        (d / f"en{i:02d}.txt").write_text(EN.format(mail=f"office{i}@water-board.example.org"))
    for i in range(5):
        (d / f"de{i:02d}.txt").write_text(DE)
    return d


def _plan(tmp_path, corpus, stages):
    cfg = load_config(None, [f"data.curate=[{','.join(stages)}]"] if stages else [])
    return prepare_data_plan(str(corpus), "**/*.txt", "auto", "text", str(tmp_path / "tok.json") if (tmp_path / "tok.json").exists() else "",
                             512, 1.0, 64, 0.002, 3, False, tokenizer_save_path=str(tmp_path / "tok.json"), tokenize_cpus=0.5,
                             curate_stages=cfg.data.curate, curate=cfg.curate)


def test_packers_curate_each_shard_before_tokenizing(ray_local, tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    plain = _plan(tmp_path, corpus, [])
    plan = _plan(tmp_path, corpus, ["unicode", "langid", "pii"])
    assert packing_key(plan) != packing_key(plain)  # curated shards never mix with uncurated ones

    root = tmp_path / "cache"
    _, stream = open_store(plan, root)
    rows = whole_epoch(stream)  # unshuffled: the samples in packing order, documents contiguous
    tok = from_json(plan.tokenizer.json)
    text = tok.decode([int(t) for r, n in zip(rows["tokens"], rows["n_real"]) for t in r[:n]])
    assert "water-board" not in text  # redacted before tokenization, to datatrove's placeholder
    assert text.count("email@example.com") == 12
    assert "Ausschuss" not in text and "Kläranlagen" not in text
    assert text.count("annual report") == 12  # every English document, once

    builds = read_records(ShardCache(str(root), plan).builds_log)
    removed = {}
    for b in builds:
        for k, v in b.get("curated", {}).items():
            removed[k] = removed.get(k, 0) + v
    assert removed == {"lang:de": 5}
    assert sum(b["tokens"] for b in builds) == int(rows["n_real"].sum())


def test_data_curate_refuses_dedup_and_unknown_stages_in_one_line():
    with pytest.raises(ConfigError, match="near_dedup is global .* run jobs/curate.py"):
        check_data_curate(load_config(None, ["data.curate=[unicode,near_dedup]"]))
    with pytest.raises(ConfigError, match="unknown stage 'nope'"):
        check_data_curate(load_config(None, ["data.curate=[nope]"]))
    with pytest.raises(ConfigError, match="perplexity scores documents under a model"):
        check_data_curate(load_config(None, ["data.curate=[perplexity]"]))
    check_data_curate(load_config(None, ["data.curate=[unicode,pii]"]))  # fine
