"""Typed configuration for every job.

Plain dataclasses (as in Ray's own examples) so a config is readable, picklable to Ray
workers and checkable before any work starts. Loading, ``--set`` overrides and cross-field
validation live in :mod:`elastic.config.load`; this file only declares fields and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class RunSection:
    """Where a run lives. ``<storage_path>/<name>`` is the run directory."""

    name: str = "tiny-demo"
    # Local directory or any pyarrow filesystem URI (s3://, gs://, ...). Relative local
    # paths are resolved against the current directory when the config is loaded.
    storage_path: str = "runs"
    seed: int = 0


@dataclass
class DataSection:
    """Raw text → tokens → packed fixed-length samples (see elastic/data)."""

    # "stdlib" (the running interpreter's standard library sources, no download), "code-opt"
    # (SFT: instruction rows built from rl.problems minus rl.heldout; the held-out problems'
    # rows are the validation set), or a path / glob / pyarrow filesystem URI of text files,
    # JSONL files or Parquet files.
    source: str = "stdlib"
    # auto | text | jsonl | parquet. auto infers from file extensions.
    format: str = "auto"
    # Glob applied when `source` is a directory.
    glob: str = "**/*"
    # Field (JSONL) or column (Parquet) holding the document text.
    text_field: str = "text"
    # Path to a HF tokenizers `tokenizer.json`; empty trains a byte-level BPE on a sample of the
    # corpus and saves it in the run directory (reused on restart so token ids never change).
    tokenizer: str = ""
    vocab_size: int = 2048
    tokenizer_sample_mb: float = 8.0
    seq_len: int = 256
    # Documents are packed within "shards" of roughly this many bytes of raw text. A shard is the
    # unit of deterministic packing and of seeking on resume (resume cost <= one shard).
    shard_mb: float = 1.0
    # Shuffle the order of shards each epoch, and of samples within each shard (deterministic
    # in run.seed, the epoch and the shard).
    shuffle: bool = True
    # A weighted mixture of sources instead of `source`, e.g. {"/data/web": 0.7, "/data/code":
    # 0.2, "stdlib": 0.1}: each global step takes floor-rounded cumulative shares of its batch
    # from each source, exact at every step and across resumes and resizes (elastic/data/mixture.py).
    # Each source is read with `format`, `glob` and `text_field`; one tokenizer serves all.
    mixture: Dict[str, float] = field(default_factory=dict)
    # Per-document curation stages run on each shard's documents just before tokenization, in
    # the store builder's packer actors, with the `curate` section's settings, e.g. [unicode,
    # langid, gopher_quality, pii]: the same stages as jobs/curate.py, applied on the fly (removed
    # documents are counted by reason in the cache's builds.jsonl). Dedup is global: run
    # jobs/curate.py for it. Empty: no curation.
    curate: List[str] = field(default_factory=list)
    # CPUs reserved by each tokenize+pack actor of the store builder's Ray Data pipeline (each
    # shard is packed once per run; the packed samples are cached under <run dir>/cache/).
    tokenize_cpus: float = 1.0
    # Shards tokenized ahead of the train workers' position (a bounded window: the cache never
    # has to hold the corpus before training starts).
    build_ahead: int = 2
    # Tokenize+pack actors per pipeline of the store builder (one pipeline for the training
    # stream, one per mixture source, one for the held-out plan while it is being built). Each
    # holds tokenize_cpus while its pipeline runs; more of them pack shards side by side.
    tokenize_actors: int = 1
    # Global batches each train worker reads ahead of the one it trains on.
    prefetch_steps: int = 2
    # How many malformed rows are reported verbatim (all are counted).
    report_bad_rows: int = 5
    # Whether a special token's spelling in the data set's text (a document, a message's
    # content, a DPO answer) means that token, for a corpus rendered with its own markers. Off
    # (the default): data is text, and only the chat template makes special tokens, so a row
    # cannot forge an end of turn or of document. Program output and environment messages in RL
    # are always text, whatever this says.
    parse_special_tokens: bool = False
    # Append the global sample ids trained on, per step and worker, to <run dir>/ledger.jsonl.
    ledger: bool = False


@dataclass
class LoRASection:
    """Low-rank adapters (elastic/model/lora.py), PEFT's LoRA: W x + (alpha / rank) B A x on the
    `targets` projections. The base weights (`model.init_from`) are frozen; only A and B train and
    only they are checkpointed (the base is referenced by path and content hash). rank 0 = off."""

    rank: int = 0
    alpha: float = 16.0
    # Dropout on the adapter's input (training only). Its random draws depend on how the batch is
    # split, so a run with dropout > 0 is not bit-exact across world sizes; 0 keeps it exact.
    dropout: float = 0.0
    # Which linear layers get adapters: wq wk wv wo (attention), w1 w2 w3 (SwiGLU MLP).
    targets: List[str] = field(default_factory=lambda: ["wq", "wk", "wv", "wo", "w1", "w2", "w3"])


@dataclass
class ModelSection:
    """Llama-style decoder. `preset` picks the sizes; any field set here overrides it."""

    preset: str = "tiny"
    # Start from existing weights: a Hugging Face LlamaForCausalLM (Llama 2/3/3.1/3.2) /
    # Qwen2ForCausalLM / Qwen3ForCausalLM directory
    # (config.json, *.safetensors, tokenizer.json) or one of our checkpoints (<run>/step_N).
    # The sizes, vocabulary and tokenizer then come from it: `preset` and `data.vocab_size`
    # are ignored, and a size field set here must agree with it (else a config error).
    init_from: str = ""
    # jobs/grpo.py and jobs/dpo.py with model.init_from empty: the SFT config whose finished run
    # is the starting policy (trained first when it is not there). Empty: jobs/configs/sft-code-opt.yaml.
    init_sft_config: str = ""
    dim: Optional[int] = None
    n_layers: Optional[int] = None
    n_heads: Optional[int] = None
    n_kv_heads: Optional[int] = None
    ffn_hidden: Optional[int] = None
    tie_embeddings: Optional[bool] = None
    rope_theta: Optional[float] = None
    norm_eps: Optional[float] = None
    # Biases on the q/k/v projections (Qwen2 has them; presets do not).
    qkv_bias: Optional[bool] = None
    # 0: a causal LM (the vocabulary projection). 1: a scalar score head (reward model, critic):
    # one value per position, never tied to the embeddings, exported as Hugging Face
    # *ForSequenceClassification with num_labels 1. With model.init_from a causal LM's backbone
    # gets a new head; a scalar-head source needs 1 here.
    num_labels: int = 0
    # auto | flash_varlen | torch_varlen | flex | sdpa_docs | sdpa_mask | sdpa_loop
    attention: str = "auto"
    # QLoRA: none | nf4. nf4 stores the frozen base's block linear weights (q k v o, gate up down)
    # in 4-bit NormalFloat with double quantization (torchao, elastic/model/quantize.py),
    # dequantized to the compute dtype in each forward; embeddings, norms and head stay as they
    # are. Needs model.lora (rank > 0); the base is model.init_from (a Hugging Face directory or
    # one of our full checkpoints, e.g. a pretrain or SFT run's step_N) or the seeded init. Each
    # rank holds the whole 4-bit base (FSDP2 shards the rest).
    quantize_base: str = "none"
    # LoRA adapters for SFT, DPO and GRPO (needs model.init_from: the frozen base).
    lora: LoRASection = field(default_factory=LoRASection)


@dataclass
class TrainSection:
    """Optimisation. Global batch is in sequences and never depends on the world size."""

    steps: int = 100
    global_batch_size: int = 16
    # Rows per forward/backward on one worker, at most (gradient accumulation inside a step): an
    # upper bound, each worker uses the largest size <= this that divides its share of the global
    # batch at the current world size, and says so once when that is smaller.
    micro_batch_size: int = 8
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    # Parameter/compute dtype under FSDP2's MixedPrecisionPolicy (reduce is always fp32).
    # auto = bf16 on CUDA, fp32 on CPU (CPU bf16 matmuls are emulated and slow).
    param_dtype: str = "auto"
    # torch.compile each transformer block: auto = on CUDA (on one H100, 1b at seq 4096: 25.4% ->
    # 38.7% MFU), off on CPU; true | false force it.
    compile: str = "auto"
    # none | full: activation checkpointing per transformer block.
    activation_checkpointing: str = "none"
    log_every: int = 10
    # Stability guard: a step whose loss or gradient norm is not finite is skipped (not applied);
    # this many consecutive bad steps stop the run cleanly (0 = never stop). A loss more than
    # `spike_z` standard deviations above the recent mean is flagged in events.jsonl.
    max_bad_steps: int = 5
    spike_z: float = 6.0
    # Measure exposed communication (profiler) on every N-th step (0 = never); see
    # elastic/train/profiling.py. Profiling costs ~10% of the step it samples.
    comm_sample_every: int = 25
    # "a:b": write a PyTorch profiler trace (Chrome/Perfetto JSON) of rank 0 for steps a..b into
    # <run dir>/profile/. Empty: no trace.
    profile_steps: str = ""
    # Stop this invocation after this step (0 = run to train.steps), checkpointing there; the
    # same run launched again resumes from it. For time-sliced clusters, tests and drills.
    until_step: int = 0


@dataclass
class ScalingSection:
    """Ray Train worker group. min < max makes the run elastic."""

    min_workers: int = 2
    max_workers: int = 2
    # auto = use GPUs when the cluster has them.
    use_gpu: str = "auto"
    # auto: a GPU run on a cluster with fewer GPUs than min_workers runs on the GPUs there are
    # (the largest world size <= the GPU count that splits the global batch; an elastic run keeps
    # its max and grows as GPUs join). strict: wait for min_workers GPUs (autoscaling clusters).
    fit: str = "auto"
    cpus_per_worker: float = 1.0
    # Extra custom resources each train worker requests (e.g. {"trainer": 1} to pin workers
    # to the KubeRay trainer group).
    resources_per_worker: Dict[str, float] = field(default_factory=dict)
    elastic_resize_monitor_interval_s: float = 60.0
    # How long Ray Train waits for a new worker group to start before retrying (with fewer
    # workers in elastic mode). After a node loss the dead node still counts until the GCS
    # notices, so the first attempt may wait this long. Keep it above pod start-up time on
    # Kubernetes; short on fixed machines.
    worker_group_start_timeout_s: float = 60.0
    max_failures: int = 3
    # Before training starts, how long the driver waits for the cluster to hold min_workers
    # workers plus one data task at once, then stops with one line naming what is missing.
    # Give an autoscaling cluster time to add nodes; 0 checks once.
    resource_wait_s: float = 60.0


@dataclass
class ParallelSection:
    """How the workers split the model (elastic/train/mesh.py). world = pp x dp_replicate x dp_shard x tp."""

    # HSDP: this many replicas of the FSDP-sharded state, each sharded over world / dp_replicate
    # workers; gradients are all-reduced between replicas. 1 = plain FSDP over every worker. An
    # elastic world it does not divide uses the largest replica count that does (gcd), and says so.
    dp_replicate: int = 1
    # Tensor + sequence parallelism over this many consecutive workers (one node on a GPU
    # cluster): each block's matmuls split Megatron-style. Heads, key/value heads and ffn_hidden
    # must divide by it; elastic runs grow and shrink in units of tp workers.
    tp: int = 1
    # Pipeline stages (elastic/train/pipeline.py): the layers split into pp x pp_virtual_stages
    # equal stages, embeddings on the first, final norm + output + loss on the last; each
    # data-parallel rank is one pipeline of pp workers (x tp), and elastic runs grow and shrink in
    # units of pp x tp workers. Pretraining and SFT; the RL and DPO jobs refuse pp > 1.
    pp: int = 1
    # gpipe | 1f1b | interleaved_1f1b | looped_bfs | interleaved_zero_bubble (the last three hold
    # pp_virtual_stages stages per rank; torch.distributed.pipelining's schedules).
    pp_schedule: str = "1f1b"
    # Micro-batches per pipelined step: a data-parallel rank's rows per optimizer step split into
    # this many (the bubble is (pp - 1) / (pp_microbatches + pp - 1) for GPipe and 1F1B).
    pp_microbatches: int = 4
    pp_virtual_stages: int = 1
    # Under tp: pretraining's and SFT's cross-entropy runs on vocabulary-sharded logits (torch's
    # loss_parallel), so no rank holds or gathers the [tokens, vocabulary] logits. false: gather
    # them first (the same loss; for comparing). RL, DPO, evaluation and a pipeline's last stage
    # always see whole logits.
    loss_parallel: bool = True


@dataclass
class SFTSection:
    """Supervised fine-tuning data (jobs/sft.py): rows are conversations; only assistant tokens
    carry loss. See elastic/data/chat.py for the rendering."""

    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str = "messages"
    # auto: the tokenizer's own chat_template (tokenizer_config.json) when it has one, else the
    # built-in template; builtin: always the built-in one.
    template: str = "auto"
    # A conversation longer than data.seq_len: truncate (the cut answer's end is not learned) or
    # skip. Both are counted with the bad rows.
    overlong: str = "truncate"


@dataclass
class EvalSection:
    """Held-out loss and perplexity (`val_loss`, `val_ppl` in metrics.jsonl), every N steps."""

    every_steps: int = 0  # 0 = off
    # Size of the fixed held-out set (packed samples), evaluated in full each time.
    samples: int = 32
    # Held-out data, same forms as data.source; empty: hold out `fraction` of the planned
    # shards of data.source (never trained on), or the held-out problems for data.source=code-opt.
    source: str = ""
    fraction: float = 0.02
    # Evaluation tasks run on the live model on the same steps (perplexity and multiple choice;
    # shipped names from datasets/eval/tasks or task YAML paths, elastic/eval/spec.py), results in
    # metrics.jsonl as eval/<task>/<metric>. Generation and code tasks: jobs/eval.py on checkpoints.
    tasks: List[str] = field(default_factory=list)
    # Items per task in training (the first N; 0: the task's own limit). Every evaluation step
    # pays for them.
    task_limit: int = 0


@dataclass
class CheckpointSection:
    every_steps: int = 50
    # Also save when this many seconds have passed since the attempt's start or its last save
    # (0 = off): saves at fixed wall-clock intervals, whatever the step time (a preemptible
    # fleet's cadence, or a race that scores policies by wall clock). Rank 0's clock decides
    # for all ranks: one small collective per step while it is on.
    every_s: float = 0.0
    keep_last: int = 2
    # true: a save blocks the step only to copy model and optimizer state to host memory
    # (pinned on CUDA) and to wait for the previous save, if it is still writing; the write
    # runs in the background and the checkpoint is registered with Ray Train at the first
    # step boundary where every rank's write is complete (the last save of a run is waited
    # for). false: the step waits for the whole write.
    async_save: bool = True


@dataclass
class WandbSection:
    # auto = online when WANDB_API_KEY is set, offline otherwise; disabled turns it off.
    mode: str = "auto"
    project: str = "elastic"
    entity: str = ""


@dataclass
class RewardSection:
    """The sandboxed compile/test/benchmark actor pool (elastic/reward)."""

    num_actors: int = 2
    # Custom resource each reward actor requests besides 1 CPU, so actors land on CPU nodes.
    # Empty: none requested.
    actor_resource: str = ""
    # Calls queued on one actor at once (single-item verifiers). A batching verifier
    # (python_tests at batch_size > 1) gets one call per actor: the rest waits in the pool,
    # which gives it to whichever actor frees first.
    max_in_flight_per_actor: int = 2
    # python_tests: up to this many programs per actor call, run in one sandbox by one warm
    # harness (harness.py --batch) instead of one sandbox and one interpreter start each.
    # Measured on 2 cores (load 6-12; bench/python_tests_throughput.py, 164 HumanEval
    # solutions): 13.3 ms of CPU per program in batches of 8 vs 33.8 ms one sandbox each (24.3
    # ms unsandboxed, one process each); a 2-actor pool scores 64 in 0.71 s vs 1.84 s at 1
    # (paired median 2.64x). With reward.batch_wait_s the batches GRPO's waiting step sends are
    # what is pending, split over all the actors in shares of at least 4 (a 16 x 4
    # python-tasks step: 4-6 interpreter starts rather than 8+). 1: one program per call.
    batch_size: int = 32
    # While no caller waits for results, a partial batch is held up to this long (from its
    # oldest item) to fill: completions trickling in during generation are then not evaluated
    # one or two at a time on the cores generation uses; a caller waiting (GRPO after
    # generation) sends what is pending at once. 0: never hold.
    batch_wait_s: float = 0.5
    item_deadline_s: float = 120.0
    max_retries: int = 2
    # Identical programs (same problem, language and extracted source) among the last
    # `dedup_window` distinct ones are evaluated once; 0 evaluates every submission.
    dedup_window: int = 1024
    # The pool is declared gone (callers get an error, the run stops) when work has waited this
    # long with no evaluation completing (every actor dying, none placeable). > item_deadline_s.
    unavailable_after_s: float = 300.0
    # wall | instructions (perf stat where the kernel counts, else valgrind callgrind).
    timing: str = "wall"
    # Wall mode: timed runs (median taken) after `warmup_runs` untimed ones.
    timing_runs: int = 5
    warmup_runs: int = 1
    # Reward of any program that fails (compile/test/limits); must be below reward_floor.
    failure_reward: float = 0.0
    # Correct programs get reward_floor + (1 - reward_floor) * (1 + tanh(log2(speedup) / speedup_scale)) / 2.
    reward_floor: float = 0.1
    speedup_scale: float = 2.0
    # Bench inputs and reference timings (per problem hash and machine); empty: ~/.cache/elastic/reward.
    cache_dir: str = ""
    compile_time_limit_s: float = 30.0
    # Wall limit of one instruction-counted run (valgrind is ~50x slower than native).
    instructions_time_limit_s: float = 120.0
    # Environment variables passed into the sandbox (nothing else is inherited).
    env_allow: List[str] = field(default_factory=list)
    # What scores a completion (elastic/reward/verifiers/registry.py): one verifier, or a weighted sum
    # such as "math_answer + 0.1*regex". code_opt (C/C++ compile, test and time; tasks from
    # rl.problems) | python_tests (HumanEval check(candidate) / MBPP test_list, sandboxed) |
    # math_answer (final answer: \boxed{}, ####, last number) | exact_match | regex | function.
    kind: str = "code_opt"
    # regex: the pattern a completion must match (re.search); empty: each task's `pattern` field.
    pattern: str = ""
    # function: the user's reward, "module:function", called as fn(completion, task) in a child
    # process of a reward actor (elastic/reward/verifiers/user_function.py); its module must be importable
    # there (PYTHONPATH, or the job's working_dir under `ray job submit`).
    function: str = ""
    # A user function that has not returned after this long is killed and scored `timeout`.
    function_timeout_s: float = 10.0
    # A number returned by a user function counts as passed (pass@k, pass rate) when >= this.
    pass_threshold: float = 1.0
    # exact_match: compare case-insensitively.
    ignore_case: bool = False
    # python_tests: time limit of each test (the harness's timer; the sandbox bounds the whole
    # run at tests x this + start-up) and the program's memory.
    python_time_limit_s: float = 3.0
    python_memory_mb: int = 512
    # python_tests: the interpreter run inside the sandbox (standard library only, -I -S -B);
    # it must live under /usr, the only tree the sandbox shows.
    python_executable: str = "python3"
    # Untrusted programs run only under bubblewrap; without it the pool refuses to start. True
    # runs them with weaker isolation (unshare namespaces, or none: no read-only filesystem view),
    # logged as a WARNING: only for programs you would run unsandboxed anyway.
    allow_weak_isolation: bool = False
    # reward.kind's `model` term: a reward model (our reward-model checkpoint <run>/step_N or a
    # Hugging Face *ForSequenceClassification directory) served by Ray actors; its score x the
    # term's weight is added to the verifiers' reward. Same tokenizer as the policy.
    model_path: str = ""
    # reward.kind's `model` term with model_path empty: the reward-model config
    # (jobs/reward_model.py) whose finished run is the reward model, trained first when it is not
    # there (as model.init_sft_config does for the policy).
    model_config: str = ""
    model_actors: int = 1
    model_batch: int = 32
    model_use_gpu: str = "auto"  # auto | true | false


@dataclass
class RolloutSection:
    """Where GRPO/PPO rollouts are generated (elastic/rl/rollout/, docs/grpo.md "Placements").

    colocated: the Ray Train workers generate, wait for rewards, then train, one after the other.
    disaggregated: a fleet of `workers` Ray actors, each with its own copy of the policy, generates
    while the trainers train; the trainers publish their weights with a version every `sync_every`
    steps and train step s on completions generated by version max(0, s - rl.max_staleness)
    (rounded up to a sync step), so a run is reproducible and resumes exactly."""

    placement: str = "colocated"
    # Rollout actors in the fleet (disaggregated); resize a running fleet with
    # scripts/scale_rollouts.sh. A killed actor is replaced and its unfinished prompts reissued.
    workers: int = 1
    # Each actor's resources: its torch threads on CPU (cpus_per_worker), or its GPUs.
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    # Publish the trainers' weights every N steps (must be <= rl.max_staleness + 1).
    sync_every: int = 1
    # Weights travel in buckets of this many MiB (one object each).
    bucket_mb: int = 64


@dataclass
class GenerationSection:
    """The generation engine (elastic/generation; docs/generation.md) for every call a run makes:
    GRPO/PPO rollouts (colocated and on the rollout fleet) and their held-out evaluation. Its KV
    cache, and speculative decoding: a drafter proposes `draft_tokens` tokens per row, the policy
    verifies them in one forward (greedy output unchanged token for token; sampled output keeps
    the policy's distribution, with other draws). Drafting runs on the static cache. And the
    weights rollouts are generated with (full, or a weight-only int8/int4 copy)."""

    # static: one preallocated slot of prompt + max_new_tokens per row (CUDA graphs on CUDA).
    # paged: blocks of `block_size` tokens allocated as rows grow and freed when they finish, a
    # GRPO group's prompt stored once (elastic/generation/paged_cache.py); the same tokens and
    # log-probs, run eagerly (no CUDA graphs).
    kv_cache: str = "static"
    # Tokens per block of the paged cache.
    block_size: int = 16
    # Speculative decoding (elastic/generation/speculative.py). none: off; ngram: prompt lookup
    # in the row's own prompt + completion (no model); otherwise a Hugging Face directory or an
    # elastic checkpoint step directory of a smaller model with the policy's vocabulary (loaded
    # on each worker and each rollout actor). Rollouts (colocated or on the fleet) and held-out
    # evaluation.
    draft: str = "none"
    # Tokens proposed per row per round (a round emits 1 to draft_tokens + 1 tokens).
    draft_tokens: int = 4
    # ngram: the longest n-gram matched (then shorter ones down to 1).
    draft_ngram: int = 3
    # full: generate with the policy's own weights (in train.param_dtype). int8: every linear
    # layer of the blocks as int8 weights with one scale per output channel (torchao
    # Int8WeightOnlyConfig); int4: 4-bit groups of 128 (torchao Int4WeightOnlyConfig, tinygemm
    # layout; CUDA and bfloat16 only: torchao 0.18 has no CPU int4 kernel). The embedding, the
    # norms and the output head stay full precision. The trainers' weights stay full precision:
    # a weight-only quantized copy (elastic/generation/quantized.py) is made again for every
    # rollout call. Held-out evaluation during training uses the full weights; jobs/eval.py has
    # its own --weights.
    weights: str = "full"


@dataclass
class RLSection:
    """GRPO (elastic/rl): rollouts, rewards, the clipped objective and its variants.

    One GRPO step samples `group_size` completions for each of `prompts_per_step` prompts, scores
    them, and trains on them for `updates_per_rollout` passes of `minibatches_per_update`
    optimizer steps each. Sampling seeds derive from `run.seed` (elastic/rl/seeds.py).
    """

    # Problem directory (datasets/README.md format); relative paths resolve against the
    # current directory.
    problems: str = "datasets/code-opt"
    # Problem ids held out from training and used for evaluation: named explicitly (not drawn
    # from a seed) so the split is visible and the same for every run. Default: one problem of
    # each kind of datasets/code-opt (algorithmic, memory_layout, repeated_work, io_buffering,
    # data_structure). Use [] for a problem set without these ids.
    heldout: List[str] = field(default_factory=lambda: [
        "longest-increasing-subsequence", "column-hashes", "polynomial-eval-modpow",
        "prefix-sums-iostream", "min-queue-operations"])
    # Greedy evaluation on the held-out problems every N steps (0 = off).
    eval_every: int = 10
    group_size: int = 4
    prompts_per_step: int = 4
    max_new_tokens: int = 256
    # Sampling for training rollouts (evaluation is greedy).
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    # Rows each rank decodes at once (elastic/generation/generate.py max_batch): when a rollout
    # finishes, the next waiting one takes its slot (continuous batching), so a step's long tail
    # does not idle the batch; a completion's tokens do not depend on this value.
    rollout_batch: int = 64
    # Clipped objective: ratio clipped to [1 - clip_low, 1 + clip_high] (clip_high > clip_low is
    # DAPO's clip-higher).
    clip_low: float = 0.2
    clip_high: float = 0.28
    # Dual-clip PPO (elastic/rl/algorithms/objective.py): for negative advantages the per-token loss is also
    # capped at -A * clip_ratio_c, so a token whose ratio grew past c since sampling cannot
    # dominate the step. 0 = off; otherwise must be > 1 (verl always uses it, with 3.0). Matters
    # only when updates_per_rollout or minibatches_per_update > 1 (otherwise the ratio is 1).
    clip_ratio_c: float = 0.0
    # KL to the initial (reference) model, as a loss term; 0 = off (no reference model kept).
    kl_coef: float = 0.0
    # k1 | k2 | k3 (Schulman's estimators; k3 is GRPO's; see elastic/rl/algorithms/kl.py for their gradients).
    kl_estimator: str = "k3"
    # token_mean (DAPO) | seq_mean_token_mean (original GRPO) | seq_mean_token_sum_norm (Dr. GRPO).
    # Normalisers count the whole optimizer step, so the split over workers never matters.
    loss_agg: str = "token_mean"
    # group_std: (r - mean) / (std + eps) per group (GRPO); none: r - mean (Dr. GRPO).
    adv_norm: str = "group_std"
    # Weight of negative advantages (W-REINFORCE's lambda, Zhu et al. 2025): 1 = plain GRPO;
    # below 1 the failing samples push down less than the passing ones pull up.
    negative_weight: float = 1.0
    # Drop groups whose rewards are all equal (zero advantage) from the step; their fraction is
    # reported. Saves the backward pass on groups that carry no policy gradient.
    filter_zero_variance: bool = True
    # PPO-style passes over one rollout batch, each split into this many optimizer steps.
    updates_per_rollout: int = 1
    minibatches_per_update: int = 1
    # Completions per forward/backward on one worker, at most (gradient accumulation inside a
    # minibatch): an upper bound, fitted like train.micro_batch_size to the worker's share.
    micro_batch_size: int = 4
    # DAPO-style length shaping (elastic/rl/algorithms/overlong.py), added to the reward: a penalty rising
    # linearly from 0 to `overlong_penalty` over the last `overlong_buffer` tokens before
    # max_new_tokens, plus `truncation_penalty` for a completion cut at max_new_tokens without
    # stopping. Both 0 = off.
    overlong_penalty: float = 0.0
    overlong_buffer: int = 64
    truncation_penalty: float = 0.0
    # Bring-your-own tasks (elastic/reward/tasks.py): a JSONL or Parquet file, local or on any
    # pyarrow filesystem, read for every reward.kind except code_opt (which reads rl.problems).
    tasks: str = ""
    # Held-out tasks in a separate file (same form); the held-out set is then this file and
    # rl.heldout must be [] (or name ids of rl.tasks to hold out instead).
    heldout_tasks: str = ""
    # Our field name -> the task file's, overriding the defaults (HumanEval/MBPP/GSM8K names:
    # id=task_id prompt=prompt answer=answer pattern=pattern code_prompt=prompt
    # entry_point=entry_point test=test test_list=test_list test_setup=test_setup_code).
    fields: Dict[str, str] = field(default_factory=dict)
    # chat: the prompt is a user message rendered by the policy's chat template (the SFT
    # format); raw: the prompt text is the model's input as is (base models, HumanEval-style
    # code continuation).
    prompt_format: str = "chat"
    # Held-out evaluation: completions per held-out task. 1: greedy pass@1; n > 1: n samples at
    # rl.temperature and the unbiased pass@k (Chen et al. 2021) for every k of eval_k <= n.
    eval_samples: int = 1
    eval_k: List[int] = field(default_factory=lambda: [1])
    # grpo: group-relative advantages. ppo: a critic (a scalar-head model, elastic/rl/ppo.py),
    # GAE advantages whitened over the step, a clipped value loss, and the KL to the reference
    # in the reward (token-level, coefficient from rl.kl_ctl); group_size may be 1.
    algorithm: str = "grpo"
    gamma: float = 1.0
    lam: float = 0.95
    # PPO's critic: initial weights from this model (a reward model's checkpoint or HF directory
    # keeps its head; a causal LM gets a new score head); empty: reward.model_path if set, else
    # the policy (model.init_from). Its own AdamW at critic_lr (constant), clipped at train.grad_clip.
    critic_init: str = ""
    critic_lr: float = 1.0e-4
    cliprange_value: float = 0.2
    vf_coef: float = 1.0
    # The first N steps train the critic only (the policy's loss is multiplied by 0).
    critic_warmup_steps: int = 0
    # KL penalty in PPO's reward: fixed (kl_coef) or adaptive (from kl_coef toward kl_target over
    # kl_horizon samples, Ziegler et al. 2019); its state is checkpointed. Adaptive needs
    # kl_horizon > prompts_per_step x group_size / 5, else one step's factor
    # 1 - 0.2 x samples / kl_horizon can be <= 0 (checked at config time).
    kl_ctl: str = "fixed"
    kl_target: float = 6.0
    kl_horizon: int = 10000
    # Disaggregated only: step s trains on completions of policy version s - max_staleness
    # (0 = on-policy: the same completions and values as colocated; 1 = generation of step s+1
    # overlaps training of step s).
    max_staleness: int = 1
    # Off-policy correction for completions of an older version: tis multiplies each token's
    # policy-gradient term by min(pi_old / pi_behaviour, is_cap) (truncated importance sampling,
    # as verl and AReaL do); none trains on them as they are. On-policy completions get none.
    is_correction: str = "tis"
    is_cap: float = 2.0
    # Multi-turn episodes with execution feedback (issue 44, docs/grpo.md): up to `turns` answers
    # per task, the verifier's feedback (elastic/reward/feedback.py) shown as the next user
    # message after each failed one. 1 = single turn. > 1: GRPO (either rollout placement) or PPO
    # (colocated), static KV cache, full generation weights, no draft (anything else is refused).
    turns: int = 1
    # The episode's reward: last (the final turn's) | discounted (sum of turn_discount^(k-1) x
    # turn k's reward), minus turn_cost per turn after the first.
    turn_reward: str = "last"
    turn_discount: float = 1.0
    turn_cost: float = 0.0
    # verdict: the verdict only (math_answer: "wrong"); details: compiler diagnostics, the first
    # failing test's input/expected/actual, the failing assertion (and a math task's gold answer
    # when the task row sets reveal_answer: true). Cut to feedback_max_tokens tokens.
    feedback: str = "verdict"
    feedback_max_tokens: int = 256
    # Your own environment (docs/grpo.md "Your own environment"): "module:Class" with
    # reset(task) -> the first user message and step(completion) -> (feedback, reward, done),
    # run on the reward pool's actors like reward.function (a raise or a hang is scored, never
    # fatal), replayed from reset for every turn, so it must be deterministic given the task and
    # the answers. It then scores every turn: reward.kind scores nothing, tasks come from
    # rl.tasks (any row with an id and a prompt). Runs on the multi-turn path (GRPO in either
    # placement, PPO colocated) also at rl.turns 1. Empty: the verifiers of reward.kind score and give the feedback.
    env: str = ""
    # Where rollouts are generated: colocated (the trainers) or disaggregated (a fleet of actors).
    rollout: RolloutSection = field(default_factory=RolloutSection)


@dataclass
class DPOSection:
    """Direct preference optimisation (jobs/dpo.py, elastic/rl/dpo.py). Rows: `prompt`, `chosen`,
    `rejected` (text, or message lists; see elastic/data/preference.py). One step trains on
    train.global_batch_size pairs, train.micro_batch_size pairs per forward."""

    # Loss on h = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]:
    # sigmoid: -log sigmoid(beta h) (DPO; with label_smoothing e: cDPO, -(1-e) log sigmoid(beta h)
    # - e log sigmoid(-beta h)); ipo: (h - 1/(2 beta))^2 with length-averaged log-probabilities.
    loss_type: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    # model: a frozen reference model sharded like the policy (under model.lora: the policy with
    # its adapters disabled, no second copy); precomputed: reference log-probs of every pair
    # computed once with Ray Data before training and stored with the run (<run>/dpo/).
    reference: str = "model"
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    # A pair whose prompt + longer response exceeds data.seq_len: truncate the responses (the
    # cut ends are not scored) or skip it. Both are counted with the bad rows.
    overlong: str = "truncate"
    # data.source: code-opt builds pairs from the problems (chosen = solutions/fast); rejected is
    # each of these that exists: "wrong" (solutions/wrong) and/or "reference" (the slow reference).
    code_opt_rejected: List[str] = field(default_factory=lambda: ["wrong", "reference"])


@dataclass
class RewardModelSection:
    """Reward-model training (jobs/reward_model.py, elastic/rl/reward_model.py) on preference
    pairs (the `dpo` section's fields, overlong rule and code-opt pairs). The model is the
    starting policy's backbone with a scalar score head (model.num_labels: 1) read at the last
    token of prompt + answer. Loss per pair (Bradley-Terry, as TRL's RewardTrainer):
    -log sigmoid(r_chosen - r_rejected - margin) + center_rewards_coefficient * (r_chosen + r_rejected)^2."""

    # Per-pair margin column ("" = none, margin 0): pairs whose chosen is much better ask for a
    # larger score gap (Llama 2's margin loss).
    margin_field: str = ""
    # Pulls the scores toward mean 0 (Eisenstein et al. 2023; TRL's center_rewards_coefficient). 0 = off.
    center_rewards_coefficient: float = 0.0


@dataclass
class CurateSection:
    """Curation (jobs/curate.py, elastic/data/curate, docs/curate.md): raw documents -> curated
    Parquet (column `text`) that data.source reads, plus a report of what was removed and why."""

    # Raw documents: "stdlib-docstrings" (each standard-library module's docstrings: English
    # prose, no download), "stdlib" (its source files: code) or a path / glob / pyarrow
    # filesystem URI of text, JSONL, Parquet, HTML or WARC files.
    source: str = "stdlib-docstrings"
    # auto | text | jsonl | parquet | html | warc. auto infers from file extensions (.html/.htm:
    # html, .warc/.warc.gz: warc; their main text extracted by trafilatura).
    format: str = "auto"
    # Glob applied when `source` is a directory.
    glob: str = "**/*"
    # Field (JSONL) or column (Parquet) holding the document text.
    text_field: str = "text"
    # Field or column with a document id ("" or absent: "<file>:<line>", "<file>:row<n>" or "<file>").
    id_field: str = "id"
    # Output directory: curated Parquet in <output>/data (use it as data.source, format parquet),
    # curate_report.json, curate_funnel.png and removed/ beside it. Rerunning resumes.
    output: str = "runs/curated"
    # Stages in order; leave one out to skip it. Per-document: unicode, langid, gopher_quality,
    # gopher_repetition, c4, fineweb, toxicity, pii, perplexity (off by default); global:
    # exact_dedup, near_dedup (always after the per-document stages).
    stages: List[str] = field(default_factory=lambda: ["unicode", "langid", "gopher_quality", "gopher_repetition", "c4",
                                                       "fineweb", "toxicity", "pii", "exact_dedup", "near_dedup"])
    # Input files are grouped into blocks of about this many MB: the unit of work and of resume.
    block_mb: float = 8.0
    # Ray Data actors running the per-document stages (one CPU each).
    workers: int = 2
    # langid: languages kept (py3langid codes).
    languages: List[str] = field(default_factory=lambda: ["en"])
    # langid: minimum probability of the top language (datatrove's LanguageFilter default).
    lang_min_score: float = 0.65
    # Gopher quality threshold overrides by rule name, over the published defaults
    # (docs/curate.md lists them), e.g. {min_doc_words: 20}.
    gopher_quality: Dict[str, float] = field(default_factory=dict)
    # Gopher repetition threshold overrides by rule name, e.g. {dup_line_frac: 0.4}.
    gopher_repetition: Dict[str, float] = field(default_factory=dict)
    # C4 rule overrides by name (1/0 for the yes/no rules), e.g. {min_sentences: 3, rewrite_lines: 0}.
    c4: Dict[str, float] = field(default_factory=dict)
    # FineWeb threshold overrides by rule name, e.g. {line_punct_ratio: 0.1}.
    fineweb: Dict[str, float] = field(default_factory=dict)
    # Single rules turned off, as "<reason prefix>:<rule>", e.g. ["c4:curly_bracket"].
    skip_rules: List[str] = field(default_factory=list)
    # toxicity: word list file, one word or phrase per line ("" = the shipped English list).
    toxic_words: str = ""
    # toxicity: the largest share of listed words a kept document may have (0 = none at all, as C4).
    toxic_threshold: float = 0.0
    # pii: kinds redacted (email, ip, ipv6, phone); redacted, never removed.
    pii_kinds: List[str] = field(default_factory=lambda: ["email", "ip", "ipv6", "phone"])
    # pii: leave private and reserved IP addresses alone (datatrove's only_remove_public_ips).
    pii_public_ips_only: bool = True
    # pii: regions (ISO codes, e.g. [US, GB, DE]) whose national phone numbers (written without +)
    # are redacted, as libphonenumber reads them; numbers with + are redacted in any country's
    # format whatever this lists. Each region is one more matcher pass (about 0.1 ms per 2 KB
    # document, docs/curate.md); [] = + numbers only. US also covers Canada and the rest of +1.
    pii_phone_regions: List[str] = field(default_factory=lambda: ["US"])
    # near_dedup: words per MinHash shingle (datatrove: 5).
    minhash_ngram: int = 5
    # near_dedup: LSH bands; bands x rows permutations (datatrove's 14 x 8 finds pairs above
    # Jaccard ~0.72 with high probability).
    minhash_bands: int = 14
    # near_dedup: permutations per band.
    minhash_rows: int = 8
    # near_dedup: seed of the permutation parameters (the same on every worker).
    minhash_seed: int = 1
    # perplexity: "" = the built-in scorer (elastic/launch/curate_scorer.py: exp of the mean
    # token NLL under perplexity_model), or a factory "package.module:function" called with
    # perplexity_model, returning a callable texts -> perplexities.
    perplexity_scorer: str = ""
    # perplexity: the model: a checkpoint (step_N), a run directory (its last step_N) or a
    # Hugging Face directory, as jobs/eval.py takes them.
    perplexity_model: str = ""
    # perplexity: documents above this are removed (0 = score only); every kept document's
    # score is the `perplexity` column of the output.
    perplexity_max: float = 0.0
    # perplexity: one GPU per per-document actor where the cluster has GPUs (else CPU).
    perplexity_use_gpu: bool = True
    # perplexity: auto (bfloat16 on GPU, float32 on CPU) | float32 | bfloat16 | float16.
    perplexity_dtype: str = "auto"
    # perplexity: tokens per forward pass (documents batched up to it; longer ones are scored
    # in windows of the model's max_seq_len).
    perplexity_token_budget: int = 8192
    # Removed documents kept as examples per reason in curate_report.json.
    examples_per_reason: int = 5


@dataclass
class LadderSection:
    """Scaling-law ladder (jobs/ladder.py, elastic/launch/ladder.py, docs/ladder.md): a grid of
    ordinary pretraining runs ("cells") under <run.storage_path>/<run.name>/runs/, each recorded
    once finished, then Chinchilla's approaches 2 and 3 fitted to their final held-out losses
    (elastic/scaling). N and FLOPs per token are elastic/model/llama.py flops_per_token's."""

    # isoflop: every size at every FLOP budget in `flops` (tokens = budget / FLOPs per token);
    # grid: every size at every token count in `tokens`.
    mode: str = "isoflop"
    # Model sizes, each a mapping of model fields applied over model.preset: dim, n_layers, n_heads,
    # and optionally n_kv_heads, ffn_hidden (e.g. {dim: 64, n_layers: 2, n_heads: 4, ffn_hidden: 176}).
    sizes: List[Dict[str, int]] = field(default_factory=list)
    # isoflop: training FLOP budgets per cell (FLOPs per token x tokens).
    flops: List[float] = field(default_factory=list)
    # grid: training tokens per cell.
    tokens: List[float] = field(default_factory=list)
    # isoflop: a size is left out of a budget when it would train on fewer tokens per parameter.
    min_tokens_per_param: float = 0.0
    # isoflop: a size is left out of a budget when it would train on more tokens per parameter.
    max_tokens_per_param: float = 1.0e6
    # isoflop: a size is left out of a budget when it would train for fewer steps.
    min_steps: int = 10
    # N_ref of the per-size rule (OLMo-style): lr = train.lr x (N / ref_params)^lr_exponent and
    # global batch = train.global_batch_size x (N / ref_params)^batch_exponent sequences.
    ref_params: float = 1.0e6
    # Exponent of the learning-rate rule (-1/3: OLMo's ladder).
    lr_exponent: float = -0.3333333
    # The rule's learning rate is clipped below at this.
    lr_min: float = 1.0e-5
    # The rule's learning rate is clipped above at this.
    lr_max: float = 1.0e-2
    # Exponent of the batch rule (2/3: OLMo's ladder; 0: train.global_batch_size for every size);
    # the batch is rounded to a power of 2 sequences.
    batch_exponent: float = 0.0
    # The rule's global batch (sequences) is clipped below at this.
    batch_min: int = 1
    # The rule's global batch (sequences) is clipped above at this.
    batch_max: int = 4096
    # Warm-up steps as a fraction of each cell's steps (then cosine decay to train.min_lr_ratio).
    warmup_fraction: float = 0.05
    # Held out of the fit and predicted from it: the cells of the `holdout` largest budgets
    # (isoflop) or largest sizes (grid); 0 fits every cell.
    holdout: int = 1
    # Cells trained at once; 0 = as many as the cluster holds (its GPUs / scaling.min_workers,
    # capped by its CPUs / one cell's workers plus two data actors).
    concurrent: int = 0
    # Bootstrap resamples of the runs for the confidence intervals (0: no intervals).
    bootstrap: int = 200
    # Level of the bootstrap percentile intervals.
    level: float = 0.95
    # A 2x2 grid of tiny cells with a few steps each (CI smoke test; replaces sizes, tokens, mode).
    smoke: bool = False


@dataclass
class Config:
    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    sft: SFTSection = field(default_factory=SFTSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    wandb: WandbSection = field(default_factory=WandbSection)
    reward: RewardSection = field(default_factory=RewardSection)
    rl: RLSection = field(default_factory=RLSection)
    generation: GenerationSection = field(default_factory=GenerationSection)
    dpo: DPOSection = field(default_factory=DPOSection)
    reward_model: RewardModelSection = field(default_factory=RewardModelSection)
    curate: CurateSection = field(default_factory=CurateSection)
    ladder: LadderSection = field(default_factory=LadderSection)


SECTIONS: List[str] = list(Config.__dataclass_fields__)
