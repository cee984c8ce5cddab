"""Per-worker training: the only layer that knows torch.distributed, FSDP and checkpoints."""
