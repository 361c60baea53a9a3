"""GRPO with speculative rollouts: config (options), grpo (advantages, losses), trainer (policy and MTP updates),
pipeline (rollout worker, async modes, weight sync, the run loop), report (`bebop report`)."""
