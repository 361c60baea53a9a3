"""GRPO arithmetic against hand-computed values, and one update on a tiny model moving the right way."""

import math

import pytest
import torch

from bebop.engine.generation import generate
from bebop.models.registry import load_model
from bebop.rl import grpo
from bebop.rl.config import RLConfig
from bebop.rl.trainer import Sample, completion_logps, pack, policy_step
from bebop.sampling import SamplingParams


def test_advantages_group_batch_none():
    r = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1])
    std1 = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 0, 0, 1]
    a = grpo.advantages(r, 4, "group")
    assert torch.allclose(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / (std1 + 1e-4))
    a = grpo.advantages(r, 4, "none")
    assert torch.allclose(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    std_all = math.sqrt((6 * 0.25 ** 2 + 2 * 0.75 ** 2) / 7)
    a = grpo.advantages(r, 4, "batch")
    assert torch.allclose(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / (std_all + 1e-4))


def test_clipped_surrogate_hand_computed():
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.25]])
    adv = torch.tensor([1.0])
    old = torch.zeros(1, 5)
    logps = ratio.log()
    signs = torch.tensor([[1.0, 1, -1, -1, 1]])  # per-token advantage sign via a per-column trick below
    losses, clipped = [], []
    for j in range(5):
        l, c = grpo.clipped_surrogate(logps[:, j:j + 1], old[:, j:j + 1], adv * signs[0, j], 0.2, 0.28)
        losses.append(float(l))
        clipped.append(bool(c))
    # ratio 1.5, A=+1: min(1.5, 1.28) -> -1.28 clipped;  0.5, A=+1: min(0.5, 0.8) -> -0.5
    # 0.5, A=-1: min(-0.5, -0.8) -> 0.8 clipped;  1.5, A=-1: min(-1.5, -1.28) -> 1.5;  1.25 < 1.28, A=+1 -> -1.25
    assert losses == pytest.approx([-1.28, -0.5, 0.8, 1.5, -1.25])
    assert clipped == [True, False, True, False, False]


def test_kl_k3_and_truncated_is():
    kl = grpo.kl_k3(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert float(kl) == pytest.approx(0.5 + math.log(2) - 1)  # exp(d) - d - 1, d = log(0.25 / 0.5)
    assert float(grpo.kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0]))) == 0
    w = grpo.truncated_is_ratio(torch.tensor([0.0, 0.0]), torch.tensor([-0.1, -5.0]), cap=3.0)
    assert w.tolist() == pytest.approx([math.exp(0.1), 3.0])


@pytest.mark.parametrize("loss_type,expected", [
    # per-token loss [[1, 2, 3, pad], [4, pad, pad, pad]], 2 sequences, 4 tokens, max length 4
    ("grpo", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
    ("dr_grpo", (1 + 2 + 3 + 4) / (2 * 4)),
    ("dapo", (1 + 2 + 3 + 4) / 4),
])
def test_loss_normalisation_and_accumulation(loss_type, expected):
    per_token = torch.tensor([[1.0, 2, 3, 99], [4, 99, 99, 99]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    w = grpo.token_weights(mask, loss_type, 4, num_sequences=2, num_tokens=4)
    assert float((per_token * w).sum()) == pytest.approx(expected)
    # two micro-batches of one sequence each add up to the same batch loss
    parts = sum(float((per_token[i:i + 1] * grpo.token_weights(mask[i:i + 1], loss_type, 4, 2, 4)).sum())
                for i in range(2))
    assert parts == pytest.approx(expected)


def test_one_step_raises_logprob_of_rewarded_samples():
    policy, tok = load_model("tiny-llama", dtype="float32")
    policy.requires_grad_(True)
    prompts = [tok("ab")["input_ids"], tok("xyz")["input_ids"]]
    rows = [p for p in prompts for _ in range(4)]
    g = generate(policy, rows, 12, SamplingParams(1.0), seed=3, mode="ar")
    rewards = torch.tensor([1.0, 0, 1, 0, 0, 1, 0, 0])
    adv = grpo.advantages(rewards, 4)
    samples = [Sample(p, r.tokens, r.logprobs, float(a)) for p, r, a in zip(rows, g.rollouts, adv)]
    cfg = RLConfig(model="tiny-llama", learning_rate=1e-3, micro_batch_size=3, loss_type="dapo")

    def seq_logps():
        with torch.no_grad():
            lp, mask, _ = completion_logps(policy, *pack(samples, "cpu")[:3], 1.0, False)
        return (lp * mask).sum(-1)

    before = seq_logps()
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    m = policy_step(policy, opt, samples, cfg, use_bf16=False)
    after = seq_logps()
    up = rewards.bool()
    assert (after[up] > before[up]).all()
    assert (after[~up] < before[~up]).all()
    # fp32 rollouts and fp32 training: the engine's log-probs are the trainer's, so the IS weight is ~1
    assert m["logprob_mismatch"] < 1e-4 and m["is_ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert m["clip_ratio"] == 0  # a single update per batch never clips
