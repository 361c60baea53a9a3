"""GRPO with speculative rollouts: config (options), grpo (advantages, losses), trainer (policy and MTP updates),
sync (weight sync and its check), workers (where rollouts run), loop (async modes, checkpoints, the run)."""
