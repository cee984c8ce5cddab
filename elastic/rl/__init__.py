"""Post-training jobs on the shared per-worker loop (elastic/train/loop.py): each supplies its
batches and its loss, and takes its math from elastic/rl/algorithms.

    algorithms/       pure functions: advantages, clipped objective, KL, GAE, value and DPO losses
    grpo.py           GRPO: rollouts on the train workers, rewards from the reward service
    ppo.py            PPO with a critic (GRPO's rollouts and rewards, a value model, GAE)
    dpo.py            DPO / IPO on preference pairs
    reward_model.py   Bradley-Terry reward-model training on the same pairs
    prompts.py        the global prompt cursor: which problems step s trains on, at any world size
    seeds.py          sampling seeds derived from ``run.seed``, independent of the world size
    split.py          train / held-out split of the problem set (``rl.heldout``)

The driver side of each job (Ray Train, the reward services) is in elastic/launch.
"""
