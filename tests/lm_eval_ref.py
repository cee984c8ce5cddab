"""A test-side reference: EleutherAI's lm-evaluation-harness (`lm_eval`) run in-process, offline,
on local JSONL files, returning per-item and per-choice numbers to check elastic/eval against.

    tasks = lm_eval_task_yamls({"hellaswag": "/tmp/x/hs.jsonl", "gsm8k": "/tmp/x/gsm.jsonl"})
    out = run_lm_eval(hf_dir, tasks, workdir="/tmp/x/lm_eval")
    out["hellaswag"][0]["lls"]          # one loglikelihood per ending, in choice order
    out[AGGREGATE]["hellaswag"]["acc_norm,none"]

`lm_eval_task_yamls` gives local copies of lm-eval's own task configs (lm_eval/tasks/hellaswag,
arc, mmlu/default, gsm8k, wikitext of the installed version: prompts, choices, targets,
delimiters, filters, metrics, stop strings) with the Hub dataset swapped for a local JSONL;
`test_lm_eval_ref.py` checks they still agree with the installed package's YAMLs.

Nothing is downloaded: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE are set for
the run, the model is a local directory, `datasets` reads JSON through its packaged builder and
caches under `workdir`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import yaml

# run_lm_eval's result: this key holds lm_eval's aggregate `results["results"]` — a dict
# {task: {"acc,none": ..., "acc_stderr,none": ..., "alias": ...}} — instead of a list of records.
AGGREGATE = "__aggregate__"

OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1"}


class FunctionRef(str):
    """A `!function module.name` value in a task YAML (resolved by lm_eval relative to the YAML's
    directory). A plain string starting with "!function " is read the same way."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(FunctionRef, lambda d, v: d.represent_scalar("!function", str(v)))


def _fn_refs(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _fn_refs(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fn_refs(v) for v in obj]
    if isinstance(obj, str) and not isinstance(obj, FunctionRef) and obj.startswith("!function "):
        return FunctionRef(obj[len("!function "):].strip())
    return obj


# Modules of the installed lm_eval copied next to the written YAMLs, so `!function` references
# run the package's own code: {file written to workdir: path under lm_eval/tasks/}.
_TASK_MODULES = {"hellaswag_utils.py": "hellaswag/utils.py", "preprocess_wikitext.py": "wikitext/preprocess_wikitext.py"}

# Fields copied from lm_eval/tasks/... of lm_eval 0.4.13 (test_lm_eval_ref.py compares them with
# the installed package). Data-location fields (dataset_path/name, *_split, tag, fewshot
# split/sampler) are replaced by `_local`; every task is evaluated on its `test` split only.
_OFFICIAL: Dict[str, Dict[str, Any]] = {
    # lm_eval/tasks/hellaswag/hellaswag.yaml (+ utils.py: process_docs → query/choices/gold)
    "hellaswag": {
        "output_type": "multiple_choice",
        "process_docs": FunctionRef("hellaswag_utils.process_docs"),
        "doc_to_text": "{{query}}",
        "doc_to_target": "{{label}}",
        "doc_to_choice": "choices",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    },
    # lm_eval/tasks/arc/arc_easy.yaml
    "arc_easy": {
        "output_type": "multiple_choice",
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_target": "{{choices.label.index(answerKey)}}",
        "doc_to_choice": "{{choices.text}}",
        "should_decontaminate": True,
        "doc_to_decontamination_query": "Question: {{question}}\nAnswer:",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    },
    # lm_eval/tasks/mmlu/default/_default_template_yaml + mmlu_<subject>.yaml (description)
    "mmlu": {
        "output_type": "multiple_choice",
        "doc_to_text": "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:",
        "doc_to_choice": ["A", "B", "C", "D"],
        "doc_to_target": "answer",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    },
    # lm_eval/tasks/gsm8k/gsm8k.yaml, with num_fewshot 0 (the official config uses 5)
    "gsm8k": {
        "output_type": "generate_until",
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True,
                         "ignore_case": True, "ignore_punctuation": False,
                         "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"]}],
        "generation_kwargs": {"until": ["Question:", "</s>", "<|im_end|>"], "do_sample": False, "temperature": 0.0},
        "repeats": 1,
        "num_fewshot": 0,
        "filter_list": [
            {"name": "strict-match",
             "filter": [{"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"}, {"function": "take_first"}]},
            {"name": "flexible-extract",
             "filter": [{"function": "regex", "group_select": -1, "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"},
                        {"function": "take_first"}]},
        ],
        "metadata": {"version": 3.0},
    },
    # lm_eval/tasks/wikitext/wikitext.yaml over a {"text": ...} JSONL: the text is scored as is
    # (no wikitext_detokenizer, which undoes wikitext-raw's " @-@ " style tokenization), so the
    # task's default process_results counts words and bytes of that same text (see the report
    # in test_lm_eval_ref.py). `lm_eval_task_yamls(..., wikitext_field="page")` gives the
    # official form instead: detokenized target, words/bytes counted on the raw page.
    "wikitext": {
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "text",
        "should_decontaminate": True,
        "doc_to_decontamination_query": "{{text}}",
        "metric_list": [{"metric": "word_perplexity"}, {"metric": "byte_perplexity"}, {"metric": "bits_per_byte"}],
        "metadata": {"version": 2.0},
    },
}

MMLU_DEFAULT_SUBJECT = "abstract_algebra"


def _mmlu_description(subject: str) -> str:
    # lm_eval/tasks/mmlu/_generate_configs.py: "The following are multiple choice questions (with
    # answers) about {subject with _ → space}.\n\n"
    return f"The following are multiple choice questions (with answers) about {' '.join(subject.split('_'))}.\n\n"


def _local(task: str, jsonl: str) -> Dict[str, Any]:
    return {"task": task, "dataset_path": "json", "dataset_name": None,
            "dataset_kwargs": {"data_files": {"test": os.path.abspath(jsonl)}},
            "test_split": "test"}


def lm_eval_task_yamls(data: Dict[str, str], mmlu_subject: str = MMLU_DEFAULT_SUBJECT,
                       wikitext_field: str = "text") -> Dict[str, Dict[str, Any]]:
    """Local lm-eval task configs, one per key of `data` (task name → local JSONL path).

    Known names and the row format each JSONL holds (the public datasets' own fields):
      hellaswag  Rowan/hellaswag: ind, activity_label, ctx_a, ctx_b, ctx, endings, source_id,
                 split, split_type, label (a string, "0".."3")
      arc_easy   allenai/ai2_arc: id, question, choices {text: [...], label: [...]}, answerKey
      mmlu       cais/mmlu: question, subject, choices (4), answer (int); one subject,
                 `mmlu_subject` (its description line as in mmlu_<subject>.yaml)
      gsm8k      openai/gsm8k: question, answer ("... #### N"); 0-shot greedy generation,
                 strict-match and flexible-extract filters
      wikitext   {"text": ...} by default (scored as is); wikitext_field="page" takes
                 EleutherAI/wikitext_document_level rows and the official detokenizer and
                 process_results (words/bytes counted on the raw page)
    The returned dicts are YAML-ready; FunctionRef values become `!function` tags."""
    out = {}
    for name, path in data.items():
        if name not in _OFFICIAL:
            raise KeyError(f"no lm-eval task config for {name!r} (known: {sorted(_OFFICIAL)})")
        cfg = {**_local(name, path), **copy.deepcopy(_OFFICIAL[name])}
        if name == "mmlu":
            cfg["description"] = _mmlu_description(mmlu_subject)
        if name == "wikitext" and wikitext_field == "page":
            cfg.update(doc_to_target=FunctionRef("preprocess_wikitext.wikitext_detokenizer"),
                       process_results=FunctionRef("preprocess_wikitext.process_results"),
                       doc_to_decontamination_query="{{page}}")
        elif name == "wikitext" and wikitext_field != "text":
            raise ValueError(f"wikitext_field must be 'text' or 'page', not {wikitext_field!r}")
        out[name] = cfg
    return out


@contextlib.contextmanager
def _offline(cache: str) -> Iterator[None]:
    """Offline flags for this run (env and the already-imported libraries' constants), and the
    datasets cache under `cache`; everything is restored afterwards."""
    env = dict(OFFLINE_ENV, HF_DATASETS_CACHE=os.path.join(cache, "datasets"))
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    patched = []
    try:
        import datasets.config as dcfg
        import huggingface_hub.constants as hcst

        for mod, attr, val in ((hcst, "HF_HUB_OFFLINE", True), (dcfg, "HF_HUB_OFFLINE", True),
                               (dcfg, "HF_DATASETS_OFFLINE", True),
                               (dcfg, "HF_DATASETS_CACHE", Path(env["HF_DATASETS_CACHE"]))):
            if hasattr(mod, attr):
                patched.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, val)
        yield
    finally:
        for mod, attr, old in reversed(patched):
            setattr(mod, attr, old)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _plain(v: Any) -> Any:
    """JSON-friendly per-sample values (tuples → lists, numpy scalars → Python)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if hasattr(v, "item") and callable(v.item):
        return v.item()
    return v


def _records(samples: List[dict], output_type: str) -> List[dict]:
    """lm_eval's logged samples (one per doc and filter) → one record per doc, in doc order."""
    by_doc: Dict[int, dict] = {}
    for s in samples:
        filt = s["filter"]
        rec = by_doc.get(s["doc_id"])
        if rec is None:
            resps = s["resps"]  # one list per request, holding `repeats` responses
            lls, greedy, generated = [], [], None
            if output_type in ("multiple_choice", "loglikelihood"):
                lls = [float(r[0][0]) for r in resps]
                greedy = [bool(r[0][1]) for r in resps]
            elif output_type == "loglikelihood_rolling":
                lls = [float(resps[0][0])]
            elif output_type == "generate_until":
                generated = resps[0][0]
            rec = by_doc[s["doc_id"]] = {
                "doc_id": int(s["doc_id"]), "doc": s["doc"], "lls": lls, "greedy": greedy,
                "generated": generated, "filtered": {}, "metrics": {},
                "arguments": _plain(s["arguments"]), "target": _plain(s["target"]),
            }
        if output_type == "generate_until":
            rec["filtered"][filt] = s["filtered_resps"][0]
        for m in s["metrics"]:
            rec["metrics"][f"{m},{filt}"] = _plain(s[m])
    return [by_doc[k] for k in sorted(by_doc)]


def run_lm_eval(model_dir: str, tasks: Dict[str, Dict[str, Any]], workdir: str, batch_size: int = 8,
                model_args: Optional[Dict[str, Any]] = None, **simple_evaluate_kwargs) -> Dict[str, Any]:
    """lm_eval's HFLM (`model="hf"`, float32, CPU) on `tasks` ({name: task config dict}, e.g.
    from lm_eval_task_yamls), fully offline; every file it writes (task YAMLs, copied task
    modules, the datasets cache) is under `workdir`.

    Returns {task: [record per doc, doc order]} plus AGGREGATE → lm_eval's `results["results"]`.
    A record:
      doc_id     int, the doc's index in the test split
      doc        the row as lm_eval saw it (after process_docs: hellaswag adds query/choices/gold)
      lls        multiple_choice: one loglikelihood per choice, in doc_to_choice order (with
                 acc_mutual_info also the unconditional ones after them); loglikelihood_rolling:
                 [the doc's total loglikelihood]; generate_until: []
      greedy     multiple_choice: per choice, whether greedy decoding reproduces the
                 continuation; [] otherwise
      generated  generate_until: the generation as HFLM returns it (cut at the first stop
                 string, before any filter); None otherwise
      filtered   generate_until: {filter name: filtered answer}; {} otherwise
      metrics    per-sample metric values keyed "metric,filter" like the aggregate dict
                 ("acc,none", "exact_match,strict-match"; perplexity metrics are
                 [loglikelihood, words or bytes] pairs)
      arguments  the requests' arguments: [(context, continuation)] for loglikelihood,
                 [(text,)] for rolling, [(context, generation kwargs)] for generation
      target     doc_to_target(doc)

    `model_args` adds to/overrides the HFLM arguments (e.g. {"max_length": 512}); other keyword
    arguments go to `lm_eval.simple_evaluate` (e.g. num_fewshot, limit)."""
    work = Path(workdir).resolve()
    (work / "tasks").mkdir(parents=True, exist_ok=True)
    cache = work / "hf_cache"
    with _offline(str(cache)):
        import lm_eval
        from lm_eval.tasks import TaskManager

        pkg_tasks = Path(lm_eval.__file__).parent / "tasks"
        for dst, src in _TASK_MODULES.items():
            shutil.copyfile(pkg_tasks / src, work / "tasks" / dst)
        for name, cfg in tasks.items():
            cfg = _fn_refs(copy.deepcopy(cfg))
            cfg["task"] = name
            kw = cfg.setdefault("dataset_kwargs", {}) or {}
            kw.setdefault("cache_dir", str(cache / "datasets"))
            cfg["dataset_kwargs"] = kw
            with open(work / "tasks" / f"{name}.yaml", "w") as f:
                yaml.dump(cfg, f, Dumper=_Dumper, sort_keys=False, allow_unicode=True)

        margs = {"pretrained": str(Path(model_dir).resolve()), "dtype": "float32", "device": "cpu"}
        margs.update(model_args or {})
        kwargs = dict(log_samples=True, batch_size=batch_size, bootstrap_iters=0)
        kwargs.update(simple_evaluate_kwargs)
        results = lm_eval.simple_evaluate(
            model="hf", model_args=",".join(f"{k}={v}" for k, v in margs.items()), tasks=list(tasks),
            task_manager=TaskManager(include_path=str(work / "tasks"), include_defaults=False), **kwargs)

    out: Dict[str, Any] = {}
    for name in tasks:
        otype = results["configs"][name]["output_type"]
        out[name] = _records(results["samples"][name], otype)
    out[AGGREGATE] = _plain(results["results"])
    return out


def tiny_llama_dir(path: str, seed: int = 0, max_seq_len: int = 512, std: float = 0.15) -> str:
    """A tiny random Llama (our Transformer, exported with elastic.model.hf.save_hf) with our
    byte-level BPE (vocab 300, EOS <|endoftext|>, pad <|pad|>, no BOS): a Hugging Face directory
    lm_eval's HFLM loads. Weights are N(0, std) (norms 1), larger than training init so that the
    choices' loglikelihoods differ clearly. max_seq_len > 256 leaves room for lm_eval's default
    max_gen_toks (256) in generate_until."""
    import torch

    from elastic.data.tokenizer import train_bpe
    from elastic.model import ModelArgs, Transformer
    from elastic.model.hf import save_hf
    from tests.hf_helpers import TEXT

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out.parent / f".{out.name}-tokenizer"
    tok_dir.mkdir(exist_ok=True)
    tok = train_bpe(TEXT + ["Question: What is 2 + 3?\nAnswer: 5 #### 5", "The quick brown fox."], 300)
    tok.save(str(tok_dir / "tokenizer.json"))
    args = ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                     max_seq_len=max_seq_len, tie_embeddings=False)
    model = Transformer(args)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std / math.sqrt(max(1.0, p.shape[-1] / 64)))
            else:
                p.fill_(1.0)
    save_hf(dict(model.named_parameters()), args, str(out), str(tok_dir / "tokenizer.json"))
    shutil.rmtree(tok_dir)
    return str(out)


def write_jsonl(path: str, rows: List[dict]) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path
