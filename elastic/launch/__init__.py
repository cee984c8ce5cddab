"""Driver side: builds Ray Train trainers, reward services and Ray Data pipelines from a config.

    driver.py     the job driver every training job runs through (`JobLaunch`, `run_job`)
    runtime/      cluster choice, run lease, GPU fit, progress line, controller events
    pretrain.py   pretraining and SFT (the packed-sample stream); data_plans.py plans their data
    dpo.py, dpo_reference.py, reward_model.py, grpo.py (GRPO and PPO): the post-training jobs
    reward_model_service.py   `reward.kind: model`: a reward model served by Ray actors
    eval.py       jobs/eval.py's driver: checkpoints on tasks, sharded over Ray workers
    curate.py, curate_scorer.py   jobs/curate.py on Ray Data
    ladder.py     the scaling-law ladder; drill.py, ledger.py: the elastic drill and its check
    lora_base.py  the frozen base a LoRA run's adapters belong to

A new job: a `JobLaunch` subclass in a module here (its `plan`, `start`, `trainer`, `stop`), a
per-worker job in elastic/train or elastic/rl, and a thin entry point in jobs/.
"""
