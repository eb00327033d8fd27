"""The torch side of the learner: what one optimizer step is, on every rank.

`Sample` (sample.py) is the seam: the bus side (learner/) decodes trajectories into samples;
this package plans them into micro-batches (prefix_plan, segments), trains them under FSDP2
(trainer, losses, reductions, ppo_health, optimizer, segment_*), loads and shards the model
(model_init, lora), checkpoints it (checkpoint, merge_adapter) and runs rank 0's commands
on every rank (ranks). Its config is `TrainerConfig` (config.py). It imports nothing of the
bus (tests/test_architecture.py). Kept empty: importing the config must not import torch.
"""
