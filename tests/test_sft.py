"""SFT: conversations through the real pipeline carry loss on assistant tokens only; malformed
rows are counted and skipped; the default job (code-opt rows) lowers its held-out loss; a stopped
SFT run resumes exactly."""

import json

import numpy as np
import pytest
import torch
import pyarrow as pa
import pyarrow.parquet as pq

from elastic.config import load_config
from elastic.data import prepare_data_plan
from elastic.data.chat import ChatFormat, RowError, render_prompt, render_segments, row_messages, tokenize_segments
from elastic.data.documents import read_shard
from elastic.data.tokenizer import from_json
from elastic.launch.pretrain import run_pretraining
from tests.helpers import ledger_by_step, open_store, read_jsonl, whole_epoch

PROMPT = "Add the two numbers in the input and print the sum."
ANSWER = "```c\n#include <stdio.h>\nint main(){long a,b;scanf(\"%ld %ld\",&a,&b);printf(\"%ld\\n\",a+b);}\n```"


def _rows(n=40, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 5))
        p, c = f"{PROMPT} (case {i})" + " please" * k, ANSWER + f"\n// variant {i}" + "\n// more" * k
        if i % 2:
            out.append({"prompt": p, "completion": c})
        else:
            out.append({"messages": [{"role": "system", "content": "Be fast."}, {"role": "user", "content": p},
                                     {"role": "assistant", "content": c}]})
    return out


def _write(d, rows, bad_lines=()):
    d.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows] + list(bad_lines)
    (d / "sft.jsonl").write_text("\n".join(lines) + "\n")
    return d / "sft.jsonl"


def test_builtin_template_learns_only_assistant_tokens():
    fmt = ChatFormat()
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]
    segs = render_segments(msgs, fmt)
    assert segs == [("<|user|>\n", False), ("hi", False), ("\n", False), ("<|assistant|>\n", False), ("yo", True),
                    (None, True), ("<|user|>\n", False), ("again", False), ("\n", False), ("<|assistant|>\n", False),
                    ("ok", True)]
    # The template's text (headers, newlines) is Markup, the only text whose special tokens parse.
    assert [type(t).__name__ for t, _ in segs if t is not None] == ["Markup", "str", "Markup", "Markup", "str"] * 2
    assert render_prompt(msgs[:1], fmt) == "<|user|>\nhi\n<|assistant|>\n"

    class Enc:  # one id per character: lets the test read the mask off the text
        def __init__(self, t):
            self.ids = [ord(ch) for ch in t]

    ids, mask = tokenize_segments(segs, lambda ts: [Enc(t) for t in ts], eos_id=0)
    learned = "".join(chr(i) if i else "<EOS>" for i, m in zip(ids, mask) if m)
    assert learned == "yo<EOS>ok"

    # "weight": 0 on an assistant message (a wrong attempt before feedback): context, not learned
    msgs[1]["weight"] = 0
    ids, mask = tokenize_segments(render_segments(row_messages({"messages": msgs}, fmt), fmt),
                                  lambda ts: [Enc(t) for t in ts], eos_id=0)
    assert "".join(chr(i) if i else "<EOS>" for i, m in zip(ids, mask) if m) == "ok"
    assert "".join(chr(i) if i else "<EOS>" for i in ids) == "<|user|>\nhi\n<|assistant|>\nyo<EOS><|user|>\nagain\n<|assistant|>\nok"
    for bad, why in (({**msgs[1], "weight": 2}, "weight"), ({**msgs[0], "weight": 0}, "weight"),
                     ({**msgs[3], "weight": 0}, "no assistant message to learn")):
        rows = [msgs[0], msgs[1], msgs[2], bad] if bad["content"] == "ok" else [msgs[0], bad]
        with pytest.raises(RowError, match=why):
            row_messages({"messages": rows}, fmt)


def test_chat_template_turns_are_found_by_rendering():
    """A Qwen-style template: only what the assistant says (and its end marker) is learned."""
    tmpl = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fmt = ChatFormat(chat_template=tmpl, eos_token="<|im_end|>")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    segs = render_segments(msgs, fmt)
    assert segs == [("<|im_start|>user\n", False), ("hi", False), ("<|im_end|>\n<|im_start|>assistant\n", False),
                    ("yo", True), ("<|im_end|>\n", True)]
    assert [type(t).__name__ for t, _ in segs] == ["Markup", "str", "Markup", "str", "Markup"]
    assert render_prompt(msgs[:1], fmt).endswith("<|im_start|>assistant\n")


def test_pipeline_masks_prompts_and_counts_bad_rows(ray_local, tmp_path):
    bad = ["{not json", json.dumps({"prompt": "only a prompt"}), json.dumps({"messages": [{"role": "user", "content": "x"}]}),
           json.dumps({"messages": "nope"})]
    src = _write(tmp_path / "data", _rows(), bad)
    pq.write_table(pa.table({"prompt": ["p1", None], "completion": ["c1", "c2"]}), tmp_path / "data" / "more.parquet")
    plan = prepare_data_plan(str(tmp_path / "data"), "**/*", "auto", "text", "", 300, 1.0, 256, 1.0, 0, False,
                             tokenizer_save_path=str(tmp_path / "tok.json"), chat=ChatFormat(), overlong="skip")
    docs, bad_rows = [], None
    for s in plan.shards:
        d, b = read_shard(s, plan.text_field, chat=plan.chat)
        docs += d
        bad_rows = b if bad_rows is None else (bad_rows.merge(b) or bad_rows)
    assert len(docs) == 41 and bad_rows.counts == {"bad_json": 1, "bad_conversation": 4}, bad_rows.counts
    assert any("sft.jsonl:44" in e for e in bad_rows.examples)  # file and line of the bad row
    tok = from_json(plan.tokenizer.json)
    _, stream = open_store(plan, tmp_path / "cache")
    epoch = whole_epoch(stream)
    rows = [{k: epoch[k][i] for k in epoch} for i in range(len(epoch["tokens"]))]
    assert rows
    learned_text = []
    for r in rows:
        labels = np.asarray(r["labels"])
        targets = labels[labels != -100]
        learned_text.append(tok.decode(targets.tolist(), skip_special_tokens=False))
    text = "".join(learned_text)
    # Every learned token is answer text or the end-of-answer EOS; no prompt, header or system text.
    assert "Add the two numbers" not in text and "<|user|>" not in text and "<|assistant|>" not in text
    assert "Be fast" not in text and text.count("printf") == 40 and text.count("<|endoftext|>") == 41
    # Examples are never split across samples: each sample's documents start at position 0.
    for r in rows:
        doc, pos = np.asarray(r["doc_ids"]), np.asarray(r["positions"])
        starts = np.r_[True, doc[1:] != doc[:-1]] & (doc >= 0)
        assert (pos[starts] == 0).all()


def _sft_overrides(store, name, steps, **extra):
    o = {"run.storage_path": str(store), "run.name": name, "data.source": "code-opt", "data.seq_len": 512,
         "data.vocab_size": 512, "data.ledger": "true", "model.dim": 64, "model.n_layers": 2, "model.n_heads": 4,
         "model.n_kv_heads": 2, "model.ffn_hidden": 128, "train.steps": steps, "train.global_batch_size": 4,
         "train.micro_batch_size": 2, "train.warmup_steps": 2, "train.lr": 0.01, "train.log_every": 1,
         "checkpoint.every_steps": 2, "eval.every_steps": 3, "eval.samples": 4, "wandb.mode": "disabled",
         "scaling.min_workers": 2, "scaling.max_workers": 2}
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


def test_code_opt_sft_lowers_heldout_loss_and_resumes_exactly(ray_local, tmp_path):
    store = tmp_path / "runs"
    steps, stop = 9, 4
    run_pretraining(load_config(None, _sft_overrides(store, "a", steps)), kind="sft")
    run_pretraining(load_config(None, _sft_overrides(store, "b", steps, **{"train.until_step": stop})), kind="sft")
    run_pretraining(load_config(None, _sft_overrides(store, "b", steps)), kind="sft")
    ma, mb = read_jsonl(store / "a" / "metrics.jsonl"), read_jsonl(store / "b" / "metrics.jsonl")
    vals = [r["val_loss"] for r in ma if "val_loss" in r]
    assert [r["step"] for r in ma if "val_loss" in r] == [3, 6, 9]
    assert vals[-1] < vals[0], vals  # held-out problems' answers get likelier
    # Held-out rows come from rl.heldout problems only, training rows from the others.
    held = [json.loads(x)["problem"] for x in (store / "a" / "data" / "code-opt-heldout.jsonl").read_text().splitlines()]
    train = [json.loads(x)["problem"] for x in (store / "a" / "data" / "code-opt-train.jsonl").read_text().splitlines()]
    assert set(held) == set(load_config(None, []).rl.heldout) and not set(held) & set(train)
    # The resumed run is the uninterrupted run: steps, losses, held-out losses and samples.
    assert [r["step"] for r in mb] == list(range(1, steps + 1))
    np.testing.assert_allclose([r["loss"] for r in mb], [r["loss"] for r in ma], rtol=1e-6)
    np.testing.assert_allclose([r["val_loss"] for r in mb if "val_loss" in r], vals, rtol=1e-6)
    assert ledger_by_step(store / "a" / "ledger.jsonl") == ledger_by_step(store / "b" / "ledger.jsonl")


def test_sft_starts_from_a_hugging_face_directory(ray_local, tmp_path):
    """model.init_from=<HF dir>: 2 FSDP workers each read only their shards (DCP's Hugging Face
    reader), the tokenizer comes from the same directory, and with lr 0 the checkpoint written
    after training holds exactly the Hugging Face weights."""
    from elastic.model.hf import from_pretrained
    from tests.hf_helpers import make_hf_dir

    hf = tmp_path / "hf-llama"
    make_hf_dir(hf, "llama")
    store = tmp_path / "runs"
    o = {k: v for k, v in (x.split("=", 1) for x in _sft_overrides(store, "from-hf", 2))}
    for k in ("model.dim", "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.ffn_hidden", "data.vocab_size"):
        o.pop(k)
    src = _write(tmp_path / "data", _rows())
    o.update({"model.init_from": str(hf), "data.source": str(src), "data.seq_len": 512, "train.lr": 1e-12,
              "train.warmup_steps": 0, "eval.every_steps": 0})
    res = run_pretraining(load_config(None, [f"{k}={v}" for k, v in o.items()]), kind="sft")
    assert res.checkpoint.endswith("step_00000002")
    ours = from_pretrained(res.checkpoint).state_dict()
    ref = from_pretrained(str(hf)).state_dict()
    assert ours.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(ours[k], ref[k], atol=1e-6, rtol=0, msg=lambda m: f"{k}: {m}")
    assert (store / "from-hf" / "tokenizer.json").read_text() == (hf / "tokenizer.json").read_text()
