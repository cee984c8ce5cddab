"""Driver side of DPO: read and tokenize the preference pairs (fails fast, one line), optionally
precompute the reference log-probs, ship the pairs to the workers, run the elastic TorchTrainer
with the DPO job.

Data: `data.source` is a JSONL/Parquet path of preference rows (elastic/data/preference.py) or
`code-opt` (pairs from datasets/code-opt: chosen = solutions/fast, rejected = solutions/wrong
and/or the reference, per `dpo.code_opt_rejected`; the `rl.heldout` problems' pairs are held
out). Held-out pairs otherwise come from `eval.source`, or a seeded `eval.fraction` of the
pairs (never trained on) when `eval.every_steps` > 0. The tokenized pairs travel to the workers
through the object store; they must fit in memory (see the preference module).
"""

from __future__ import annotations

import os
from typing import Optional, TextIO

from elastic.config import Config, ConfigError
from elastic.config.load import resolved_tokenizer
from elastic.data.chat import ChatFormat
from elastic.data.preference import PairFormat, PairSet, code_opt_pair_rows, holdout_split, load_pairs
from elastic.data.sources import DataError
from elastic.data.tokenizer import from_json, load_or_train
from elastic.launch.data_plans import CODE_OPT, keep_tokenizer, role_marker_warning
from elastic.launch.driver import JobLaunch, JobResult, RunPaths, build_torch_trainer, run_job
# (before any Ray activity: see elastic/launch/pretrain.py)
from elastic.launch.dpo_reference import reference_table
from elastic.rl.dpo import dpo_loop_per_worker


def dpo_sources(cfg: Config, local_dir: str) -> tuple[str, str]:
    """(train source, held-out source or ""): for code-opt, the pair rows written into the run."""
    if cfg.data.source == "stdlib":
        raise DataError("data.source stdlib: DPO trains on preference rows (JSONL/Parquet with prompt, chosen, rejected) "
                        "or data.source=code-opt")
    if cfg.data.source != CODE_OPT:
        return cfg.data.source, cfg.eval.source
    from elastic.data.code_opt import problem_ids, write_jsonl
    from elastic.rl.split import split_problems

    split = split_problems(problem_ids(cfg.rl.problems), cfg.rl.heldout, where=cfg.rl.problems)
    d = os.path.join(local_dir, "data")
    rej = cfg.dpo.code_opt_rejected
    train = write_jsonl(code_opt_pair_rows(cfg.rl.problems, split.train, rej), os.path.join(d, "dpo-code-opt-train.jsonl"))
    held = (write_jsonl(code_opt_pair_rows(cfg.rl.problems, split.heldout, rej), os.path.join(d, "dpo-code-opt-heldout.jsonl"))
            if split.heldout else "")
    return train, cfg.eval.source or held


class DPOLaunch(JobLaunch):
    job = "dpo"
    label = "DPO"

    def pair_format(self, cfg: Config) -> PairFormat:
        return PairFormat(cfg.dpo.prompt_field, cfg.dpo.chosen_field, cfg.dpo.rejected_field)

    def plan(self, cfg: Config, paths: RunPaths, say) -> None:
        from elastic.model.hf import check_init_from

        if not cfg.model.init_from:
            raise ConfigError(f"model.init_from: {self.label} starts from a trained policy (an SFT checkpoint <run>/step_N or a "
                              f"Hugging Face directory); jobs/{self.job}.py runs the default SFT first when it is empty")
        check_init_from(cfg)  # names and shapes from headers/metadata: one line, before any worker
        tok_path = resolved_tokenizer(cfg)
        if not tok_path or not os.path.isfile(tok_path):
            raise DataError(f"model.init_from {cfg.model.init_from}: no tokenizer.json with it (set data.tokenizer)")
        self.tok = load_or_train(tok_path, "", [], cfg.data.vocab_size)
        keep_tokenizer(tok_path, paths.local_dir)
        self.chat = ChatFormat(chat_template=None if cfg.sft.template == "builtin" else self.tok.chat_template,
                               eos_token=self.tok.eos_token, bos_token=self.tok.bos_token,
                               parse_special_tokens=cfg.data.parse_special_tokens)
        warning = role_marker_warning(self.tok.json, self.chat)
        if warning:
            say(warning)
        d, fmt = cfg.dpo, self.pair_format(cfg)
        train_src, held_src = dpo_sources(cfg, paths.local_dir)
        tokenizer = from_json(self.tok.json)

        def load(src: str):
            return load_pairs(src, cfg.data.glob, cfg.data.format, fmt, self.chat, tokenizer, self.tok.eos_id,
                              cfg.data.seq_len, d.overlong, cfg.data.report_bad_rows)

        train, bad = load(train_src)
        held: Optional[PairSet] = None
        if cfg.eval.every_steps > 0:
            if held_src:
                held, hbad = load(held_src)
                bad.merge(hbad)
            else:
                tr, he = holdout_split(len(train), cfg.eval.fraction, cfg.run.seed)
                train, held = train.subset(tr), train.subset(he)
        if not len(train):
            raise DataError(f"data.source {cfg.data.source}: no usable preference pairs ({bad.total} rows skipped; "
                            f"first: {'; '.join(bad.examples) or 'none'})")
        if held is not None and not len(held):
            raise DataError(f"eval.source {held_src}: no usable preference pairs")
        self.pairs = {"train": train, "heldout": held}
        self.bad = bad
        self.cfg = cfg
        self.ref_table = None
        self.say = say  # the job's console (the reference table says whether it was reused)

    def describe(self) -> list:
        cfg, tr, he = self.cfg, self.pairs["train"], self.pairs["heldout"]
        d = cfg.dpo
        loss = d.loss_type + (f", label smoothing {d.label_smoothing:g}" if d.label_smoothing else "")
        ref = ("precomputed (Ray Data, stored with the run)" if d.reference == "precomputed"
               else "the policy with adapters off" if cfg.model.lora.rank > 0 else "a frozen sharded copy")
        lines = [f"[elastic] DPO: {len(tr)} pairs ({tr.tokens()} tokens)"
                 + (f", {len(he)} held out" if he is not None else "")
                 + f"; beta {d.beta:g}, loss {loss}; reference: {ref}; policy from {cfg.model.init_from}"]
        return lines + self.bad_rows_lines()

    def bad_rows_lines(self) -> list:
        if not self.bad.total:
            return []
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.bad.counts.items()))
        return [f"[elastic] preference rows skipped or cut: {self.bad.total} ({counts}); first: {'; '.join(self.bad.examples)}"]

    def start(self, cfg: Config, paths: RunPaths) -> None:
        if cfg.dpo.reference == "precomputed":

            self.ref_table = reference_table(cfg, paths.local_dir, self.pairs, say=self.say)

    def trainer(self, cfg: Config, paths: RunPaths, gpu: bool):
        import ray


        extra = {"pairs": ray.put(self.pairs), "bad_rows_total": self.bad.total}
        if self.ref_table is not None:
            extra["ref_logps"] = ray.put(self.ref_table)
        return build_torch_trainer(cfg, paths, gpu, dpo_loop_per_worker, extra)


def run_dpo(cfg: Config, out: Optional[TextIO] = None, progress: bool = True) -> JobResult:
    return run_job(cfg, DPOLaunch(), out, progress)
