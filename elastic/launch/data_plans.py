"""Driver-side data planning for language-modelling jobs (pretraining, SFT): the training plan
and the held-out plan, from the config. Runs before any worker starts, so every data error is
one line before Ray does any work.

Held-out data (`eval`): `eval.source` when given; for `data.source: code-opt` the held-out
problems' rows; otherwise the last `eval.fraction` of the planned shards, which are then
removed from the training plan (held out means never trained on).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from typing import Optional

from elastic.config import Config
from elastic.config.load import resolved_tokenizer
from elastic.data.chat import ChatFormat
from elastic.data.code_opt import problem_ids, sft_rows, write_jsonl
from elastic.data.pipeline import DataPlan, prepare_data_plan
from elastic.data.sources import DataError

CODE_OPT = "code-opt"


@dataclass
class JobData:
    train: DataPlan  # or a MixturePlan (data.mixture)
    eval: Optional[DataPlan] = None


def _offset_ids(plan: DataPlan, offset: int) -> DataPlan:
    """The plan with its shard ids moved up by `offset`: sample ids stay unique across the
    sources of a mixture."""
    return dataclasses.replace(plan, shards=[dataclasses.replace(s, shard_id=s.shard_id + offset) for s in plan.shards])


def plan_mixture(cfg: Config, local_dir: str) -> JobData:
    """data.mixture: one plan per source over one tokenizer (the given one, or one trained on
    a sample drawn from every source in proportion to its weight); held-out shards are the
    last `eval.fraction` of each source's."""
    from elastic.data.mixture import MixturePlan, exact_weights
    from elastic.data.pipeline import _tokenizer_sample
    from elastic.data.shards import plan_shards
    from elastic.data.sources import resolve_files
    from elastic.data.tokenizer import load_or_train

    d, ev = cfg.data, cfg.eval
    if len(d.mixture) < 2:
        raise DataError(f"data.mixture needs at least two sources, got {len(d.mixture)}")
    try:
        exact_weights(list(d.mixture.values()))
    except ValueError as e:
        raise DataError(f"data.mixture: {e}") from None
    if d.source == CODE_OPT or CODE_OPT in d.mixture:
        raise DataError(f"data.mixture: {CODE_OPT} rows are for SFT on their own, not in a mixture")
    tok_path = os.path.join(local_dir, "tokenizer.json")
    tokenizer = resolved_tokenizer(cfg)
    if not tokenizer and not os.path.isfile(tok_path):
        total = sum(d.mixture.values())
        sample = []
        for src, w in d.mixture.items():
            files = resolve_files(src, d.glob, d.format)
            shards = plan_shards(files, max(1, int(d.shard_mb * 2**20)), cfg.run.seed if d.shuffle else None)
            sample += _tokenizer_sample(files, shards, d.text_field, int(d.tokenizer_sample_mb * 2**20 * w / total))
        if not sample:
            raise DataError("data.mixture: no valid documents found in any source")
        load_or_train("", tok_path, sample, d.vocab_size)
    tok = tokenizer or tok_path
    plans, held, offset = [], [], 0
    for src in d.mixture:
        p = _offset_ids(prepare_data_plan(src, d.glob, d.format, d.text_field, tok, d.vocab_size, d.tokenizer_sample_mb,
                                          d.seq_len, d.shard_mb, cfg.run.seed, d.shuffle, tokenize_cpus=d.tokenize_cpus,
                                          report_bad_rows=d.report_bad_rows, curate_stages=d.curate, curate=cfg.curate,
                                          parse_special_tokens=d.parse_special_tokens), offset)
        offset += p.num_shards
        if ev.every_steps > 0 and not ev.source:
            k = max(1, round(ev.fraction * p.num_shards))
            if p.num_shards - k < 1:
                raise DataError(f"eval.fraction {ev.fraction}: data.mixture source {src} has only {p.num_shards} shard(s); "
                                "lower data.shard_mb or set eval.source")
            held += p.shards[p.num_shards - k:]
            p = dataclasses.replace(p, shards=p.shards[:p.num_shards - k])
        plans.append(p)
    if tokenizer:
        keep_tokenizer(tokenizer, local_dir)
    train = MixturePlan(plans, list(d.mixture.values()), list(d.mixture))
    if ev.every_steps <= 0:
        return JobData(train)
    if ev.source:
        e = prepare_data_plan(ev.source, d.glob, d.format, d.text_field, tok, d.vocab_size, d.tokenizer_sample_mb, d.seq_len,
                              d.shard_mb, cfg.run.seed, d.shuffle, tokenize_cpus=d.tokenize_cpus, report_bad_rows=d.report_bad_rows,
                              curate_stages=d.curate, curate=cfg.curate, parse_special_tokens=d.parse_special_tokens)
        return JobData(train, _offset_ids(e, offset))
    return JobData(train, dataclasses.replace(plans[0], shards=held))


def role_marker_warning(tokenizer_json: str, chat: Optional[ChatFormat]) -> Optional[str]:
    """One line when the built-in template renders conversations with a tokenizer whose role
    markers are not special tokens (one trained before they were, or a given one without a
    chat_template): its headers are then plain text that a message can spell."""
    if chat is None or chat.chat_template is not None:
        return None
    from elastic.data.tokenizer import from_json, missing_role_markers

    missing = missing_role_markers(from_json(tokenizer_json))
    if not missing:
        return None
    return (f"[elastic] warning: the tokenizer has no special {' '.join(missing)} token(s): the built-in chat template's "
            "role headers are plain text, which a message can spell (retrain the tokenizer here, or use one with a chat_template)")


def chat_format(cfg: Config) -> ChatFormat:
    s = cfg.sft
    # The template itself comes from the tokenizer at planning time (unless forced builtin).
    return ChatFormat(prompt_field=s.prompt_field, completion_field=s.completion_field, messages_field=s.messages_field)


def _code_opt_sources(cfg: Config, local_dir: str) -> tuple[str, str]:
    """Write the code-opt instruction rows (train problems, held-out problems) into the run."""
    from elastic.rl.split import split_problems

    split = split_problems(problem_ids(cfg.rl.problems), cfg.rl.heldout, where=cfg.rl.problems)
    d = os.path.join(local_dir, "data")
    train = write_jsonl(sft_rows(cfg.rl.problems, split.train), os.path.join(d, "code-opt-train.jsonl"))
    held = write_jsonl(sft_rows(cfg.rl.problems, split.heldout), os.path.join(d, "code-opt-heldout.jsonl")) if split.heldout else ""
    return train, held


def keep_tokenizer(tokenizer_json: str, run_dir: str) -> None:
    """Copy a given tokenizer (and its tokenizer_config.json: special tokens, chat template) into
    the run directory, so the run's checkpoints export and load on their own."""
    os.makedirs(run_dir, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(os.path.dirname(os.path.abspath(tokenizer_json)), name) if name != "tokenizer.json" else tokenizer_json
        dst = os.path.join(run_dir, name)
        if os.path.isfile(src) and os.path.abspath(src) != os.path.abspath(dst):
            shutil.copyfile(src, dst)


def check_data_curate(cfg: Config) -> None:
    """data.curate names per-document stages of elastic/data/curate (one line before any work)."""
    stages = cfg.data.curate
    if not stages:  # the curation stages' own libraries (phonenumbers, ftfy, py3langid) stay unloaded
        return
    from elastic.config import ConfigError
    from elastic.data.curate.base import STAGES
    from elastic.data.curate.pipeline import check_curate_config

    dedup = [x for x in stages if x in ("exact_dedup", "near_dedup")]
    if dedup:
        raise ConfigError(f"data.curate: {dedup[0]} is global (it compares documents across the corpus): "
                          "run jobs/curate.py, then train on its output")
    if "perplexity" in stages:
        raise ConfigError("data.curate: perplexity scores documents under a model: run jobs/curate.py with "
                          "curate.perplexity_model, then train on its output")
    unknown = [x for x in stages if x not in STAGES]
    if unknown:
        raise ConfigError(f"data.curate: unknown stage {unknown[0]!r} (known: {', '.join(sorted(STAGES))})")
    check_curate_config(dataclasses.replace(cfg.curate, stages=list(stages)))


def plan_job_data(cfg: Config, local_dir: str, kind: str) -> JobData:
    """kind: "pretrain" (text) or "sft" (conversations)."""
    d, ev = cfg.data, cfg.eval
    check_data_curate(cfg)
    if d.mixture:
        if kind != "pretrain":
            raise DataError(f"data.mixture: mixtures are for pretraining, not {kind}")
        return plan_mixture(cfg, local_dir)
    chat = chat_format(cfg) if kind == "sft" else None
    source, eval_source = d.source, ev.source
    if d.source == CODE_OPT:
        if kind != "sft":
            raise DataError(f"data.source {CODE_OPT}: instruction rows are for SFT (jobs/sft.py), not {kind}")
        source, held = _code_opt_sources(cfg, local_dir)
        eval_source = eval_source or held
    tok_path = os.path.join(local_dir, "tokenizer.json")

    def plan(src: str, tokenizer: str) -> DataPlan:
        p = prepare_data_plan(src, d.glob, d.format, d.text_field, tokenizer, d.vocab_size, d.tokenizer_sample_mb,
                              d.seq_len, d.shard_mb, cfg.run.seed, d.shuffle, tokenizer_save_path=tok_path,
                              tokenize_cpus=d.tokenize_cpus, report_bad_rows=d.report_bad_rows, chat=chat,
                              overlong=cfg.sft.overlong, curate_stages=d.curate, curate=cfg.curate,
                              parse_special_tokens=d.parse_special_tokens)
        if chat is not None and cfg.sft.template == "builtin":
            p = dataclasses.replace(p, chat=dataclasses.replace(p.chat, chat_template=None))
        return p

    tokenizer = resolved_tokenizer(cfg)  # data.tokenizer, or the one that comes with model.init_from
    train = plan(source, tokenizer)
    if tokenizer:
        keep_tokenizer(tokenizer, local_dir)
    if ev.every_steps <= 0:
        return JobData(train)
    if eval_source:
        # Same tokenizer as training (the one given, or the one just trained and saved).
        return JobData(train, plan(eval_source, tokenizer or tok_path))
    n = train.num_shards
    k = max(1, round(ev.fraction * n))
    if n - k < 1:
        raise DataError(f"eval.fraction {ev.fraction}: data.source {d.source} has only {n} shard(s); "
                        "lower data.shard_mb or set eval.source")
    return JobData(dataclasses.replace(train, shards=train.shards[:n - k]),
                   dataclasses.replace(train, shards=train.shards[n - k:]))
