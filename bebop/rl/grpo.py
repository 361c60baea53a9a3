"""GRPO's arithmetic on plain tensors: group-normalised advantages, the clipped surrogate with truncated
importance sampling, the k3 KL estimator and the three loss normalisations (as TRL's GRPOTrainer defines them).

Shapes: completions are right-padded to [N, L] with a 0/1 `mask`; advantages are per sequence [N].
"""

import torch


def advantages(rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """A_i = r_i - mean(group), divided by the group's std ('group'), the whole batch's std ('batch') or not at
    all ('none', Dr. GRPO). Rewards are [P * G], each prompt's G completions adjacent."""
    r = rewards.view(-1, group_size).double()
    centred = r - r.mean(1, keepdim=True)
    if scale == "group":
        centred = centred / (r.std(1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (r.std() + eps)
    elif scale != "none":
        raise ValueError(f"unknown scale_rewards '{scale}'")
    return centred.flatten().float()


def truncated_is_ratio(old_logps: torch.Tensor, sampling_logps: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token importance weight pi_old / pi_rollout, capped at `cap` (truncated IS, TRL's token_truncate):
    corrects for the rollout side's different numerics (bf16) and, in one-step mode, its older weights."""
    return (old_logps - sampling_logps).exp().clamp(max=cap)


def kl_k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimator exp(d) - d - 1 with d = log pi_ref - log pi (>= 0, unbiased)."""
    d = ref_logps - logps
    return d.exp() - d - 1


def clipped_surrogate(logps, old_logps, adv, eps_low: float, eps_high: float):
    """Per-token -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) with ratio = pi / pi_old, and the
    boolean map of tokens where the clip is active (the gradient is cut there)."""
    ratio = (logps - old_logps).exp()
    a = adv.unsqueeze(-1)
    loss = -torch.min(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
    clipped = ((ratio < 1 - eps_low) & (a < 0)) | ((ratio > 1 + eps_high) & (a > 0))
    return loss, clipped


def token_weights(mask: torch.Tensor, loss_type: str, max_completion_length: int, num_sequences: int,
                  num_tokens: int) -> torch.Tensor:
    """Weight of each token in the batch loss, so that a micro-batch's sum(per_token_loss * w) is its exact share
    of the whole batch's loss (gradient accumulation gives the same gradient as one big batch):
      grpo     mean over each sequence's tokens, then over sequences (long answers weigh less per token)
      dr_grpo  sum over tokens / (num_sequences * max_completion_length) (no length bias)
      dapo     sum over tokens / all tokens in the batch (token-level)."""
    mask = mask.float()
    if loss_type == "grpo":
        return mask / mask.sum(-1, keepdim=True).clamp_min(1) / num_sequences
    if loss_type == "dr_grpo":
        return mask / (num_sequences * max_completion_length)
    if loss_type == "dapo":
        return mask / max(num_tokens, 1)
    raise ValueError(f"unknown loss_type '{loss_type}'")
