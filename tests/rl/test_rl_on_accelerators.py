"""GRPO on an accelerator (the `accelerator` fixture: CUDA where torch sees a GPU; skipped with a reason elsewhere,
or run on the CPU with BEBOP_TEST_DEVICES=cpu): the trainer and the speculative rollouts share the device, as TRL's
colocate mode and verl's hybrid engine do, and two steps train the policy there."""

import json

import torch

from bebop.drafts.mtp import new_mtp
from bebop.models.registry import load_model
from bebop.rl.config import RLConfig
from bebop.rl.loop import run_rl
from rl_helpers import EVAL, TRAIN


def test_two_grpo_steps_with_speculative_rollouts_on_the_device(accelerator, tmp_path):
    cfg = RLConfig(model="tiny-llama", device=str(accelerator), steps=2, prompts_per_step=2, num_generations=3,
                   max_completion_length=10, learning_rate=1e-3, micro_batch_size=4, rollout="spec", draft_len=3,
                   eval_prompts=2, threads=2).validate()  # autocast and rollout dtype auto: bf16 both on a GPU
    policy, tok = load_model(cfg.model, dtype="float32", device=cfg.device)
    before = policy.embed.weight.detach().clone()
    rows = run_rl(cfg, tmp_path / "run", policy, tok, TRAIN, EVAL, new_mtp(policy, seed=1), progress=False)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["acceptance_rate"] is not None for r in rows)  # the rollouts drafted
    assert policy.embed.weight.device.type == accelerator.type
    assert not torch.equal(policy.embed.weight, before)  # the policy trained
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    if accelerator.type == "cuda":  # no CPU probe there: bf16 autocast and bf16 rollouts
        assert run["use_bf16"] and run["rollout_dtype"] == "bfloat16"
