"""The learner side: one GRPO policy update on a batch of scored rollouts, and the online MTP update.

The policy trains in fp32 master weights; forwards may run under bf16 autocast (`use_bf16`), which on CPUs
with bf16 matrix units is several times faster. Micro-batches accumulate gradients so that the update equals
one step on the whole batch (bebop.rl.grpo.token_weights); then gradient clipping and AdamW.
"""

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bebop.engine.scheduler import right_pad
from bebop.io import write_text_atomic
from bebop.models import cpu, tuning
from bebop.rl import grpo
from bebop.rl.config import RLConfig
from bebop.training.losses import loss_value
from bebop.training.targets import autocast, depth_tensors

AUTOCAST_CACHE = "autocast-probe-v1.json"  # in the probes' cache directory, beside the dtype probe's file
MTP_LOSS = {"online-ce": "ce", "online-kl": "kl", "online-e2e-tv": "e2e-tv"}


@dataclass
class Sample:
    """One scored completion, plain data (what crosses the worker boundary plus the reward)."""
    prompt_ids: list[int]
    completion_ids: list[int]
    sampling_logps: list[float]  # log-probs under the rollout side's sampling distribution
    advantage: float = 0.0


def pack(samples: list[Sample], device):
    """Right-padded [B, S] prompt+completion tokens, prompt and completion lengths, sampling log-probs [B, Lc]."""
    seqs = [s.prompt_ids + s.completion_ids for s in samples]
    tokens = right_pad(seqs)
    lc = max(max(len(s.completion_ids) for s in samples), 1)
    sampling = torch.zeros(len(samples), lc)
    for i, s in enumerate(samples):
        sampling[i, :len(s.sampling_logps)] = torch.tensor(s.sampling_logps)
    plen = torch.tensor([len(s.prompt_ids) for s in samples])
    clen = torch.tensor([len(s.completion_ids) for s in samples])
    return tokens.to(device), plen.to(device), clen.to(device), sampling.to(device)


def completion_logps(model, tokens, plen, clen, temperature: float, use_bf16: bool, entropy: bool = False):
    """log pi(completion token) at the sampling temperature [B, Lc], the completion mask [B, Lc], and the last
    hidden states [B, S, d] (with `entropy`, also the entropy of pi at each position [B, Lc], no gradient).
    Logits are computed only at the positions that predict completion tokens."""
    B, S = tokens.shape
    Lc = max(int(clen.max()), 1)
    with autocast(model, use_bf16):
        hidden = model.forward_full(tokens)
        pos = (plen.unsqueeze(1) - 1 + torch.arange(Lc, device=tokens.device)).clamp(max=S - 2)
        rows = torch.arange(B, device=tokens.device).unsqueeze(1)
        logits = model.logits(hidden[rows, pos])
    all_logps = F.log_softmax(logits.float() / temperature, -1)
    logps = all_logps.gather(-1, tokens[rows, pos + 1].unsqueeze(-1)).squeeze(-1)
    mask = torch.arange(Lc, device=tokens.device).unsqueeze(0) < clen.unsqueeze(1)
    if entropy:
        with torch.no_grad():
            ent = -(all_logps.exp() * all_logps).sum(-1)
        return logps, mask, hidden, ent
    return logps, mask, hidden


def policy_step(policy, opt, samples: list[Sample], cfg: RLConfig, use_bf16: bool, ref=None) -> dict:
    """num_iterations GRPO updates on one batch. The first pass's log-probs are pi_old (the weights the batch is
    trained from); the rollout's own log-probs only enter through the truncated IS weight."""
    device = policy.embed.weight.device
    micro = [samples[i:i + cfg.micro_batch_size] for i in range(0, len(samples), cfg.micro_batch_size)]
    n_tokens = sum(len(s.completion_ids) for s in samples)
    olds, sums = [], {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "mismatch": 0.0, "is_ratio": 0.0, "entropy": 0.0,
                      "tokens": 0}
    is_max, grad_norms = 0.0, []
    policy.train()
    for it in range(cfg.num_iterations):
        opt.zero_grad(set_to_none=True)
        for m, part in enumerate(micro):
            tokens, plen, clen, sampling = pack(part, device)
            adv = torch.tensor([s.advantage for s in part], device=device)
            logps, mask, _, ent = completion_logps(policy, tokens, plen, clen, cfg.temperature, use_bf16, entropy=True)
            if it == 0:
                sums["entropy"] += float((ent * mask).sum())
                old = logps.detach()
                is_w = grpo.truncated_is_ratio(old, sampling[:, :old.shape[1]], cfg.importance_sampling_cap)
                olds.append((old, is_w))
                sums["mismatch"] += float(((old - sampling[:, :old.shape[1]]).abs() * mask).sum())
                sums["is_ratio"] += float((is_w * mask).sum())
                is_max = max(is_max, float(torch.where(mask, is_w, 0).max()))
            old, is_w = olds[m]
            per_token, clipped = grpo.clipped_surrogate(logps, old, adv, cfg.epsilon, cfg.clip_high)
            per_token = per_token * is_w
            if cfg.beta > 0:
                with torch.no_grad():
                    ref_logps, _, _ = completion_logps(ref, tokens, plen, clen, cfg.temperature, use_bf16)
                kl = grpo.kl_k3(logps, ref_logps)
                per_token = per_token + cfg.beta * kl
                sums["kl"] += float((kl.detach() * mask).sum())
            w = grpo.token_weights(mask, cfg.loss_type, cfg.max_completion_length, len(samples), n_tokens)
            loss = (per_token * w).sum()
            loss.backward()
            sums["loss"] += float(loss.detach())
            sums["clipped"] += float((clipped & mask).sum())
            sums["tokens"] += int(mask.sum())
        params = [p for p in policy.parameters() if p.grad is not None]
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or float("inf"))))
        opt.step()
    policy.eval()
    t = max(sums["tokens"], 1)
    first = max(n_tokens, 1)
    return {"loss": sums["loss"] / cfg.num_iterations, "kl": sums["kl"] / t if cfg.beta > 0 else None,
            "clip_ratio": sums["clipped"] / t, "logprob_mismatch": sums["mismatch"] / first,
            "is_ratio_mean": sums["is_ratio"] / first, "is_ratio_max": is_max, "grad_norm": grad_norms[-1],
            "policy_entropy": sums["entropy"] / first}


def mtp_step(mtp, opt, policy, samples: list[Sample], cfg: RLConfig, use_bf16: bool) -> dict:
    """One update of the MTP on this step's rollouts with the strategy's loss. The policy trunk is detached: its
    hidden states and teacher distribution come from a no-grad forward of the current policy."""
    name = MTP_LOSS[cfg.draft_strategy]
    device = policy.embed.weight.device
    micro = [samples[i:i + cfg.micro_batch_size] for i in range(0, len(samples), cfg.micro_batch_size)]
    mtp.train()
    opt.zero_grad(set_to_none=True)
    total = 0.0
    for part in micro:
        tokens, plen, clen, _ = pack(part, device)
        with torch.no_grad(), autocast(policy, use_bf16):
            out = policy.forward_full(tokens, capture=mtp.feature_layers)
            hidden, captured = out if mtp.feature_layers else (out, None)
            hidden = hidden.float()
            captured = None if captured is None else captured.float()
            lse = (policy.logits(hidden).float() / cfg.temperature).logsumexp(-1)
        q_logits, p, labels, mask = depth_tensors(mtp, tokens, plen + clen, plen, hidden, lse, captured,
                                                  cfg.draft_depth, cfg.temperature)
        if len(mask) == 0:
            continue
        loss = loss_value(name, q_logits, p, labels, mask) * len(part) / len(samples)
        loss.backward()
        total += float(loss.detach())
    params = [p for p in mtp.parameters() if p.grad is not None]
    if params:
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm or float("inf"))
        opt.step()
    mtp.eval()
    return {"mtp_loss": total}


def bf16_autocast_is_faster(policy, micro_batch_size: int, seq_len: int, reps: int = 1) -> tuple[bool, dict]:
    """Time forward+backward of one micro-batch with and without bf16 autocast (interleaved, after a warm-up);
    True if autocast is faster on this machine. Gradients are cleared afterwards. Where the CPU has no native bf16
    (bebop.models.cpu), bf16 would run emulated, far slower: the answer is False without timing it."""
    if policy.embed.weight.device.type == "cpu" and not cpu.native_bf16():
        return False, {"bf16": f"not timed: this CPU ({cpu.describe()}) has no native bf16"}
    tokens = torch.randint(0, policy.cfg.vocab_size, (micro_batch_size, seq_len), device=policy.embed.weight.device)
    times = {False: [], True: []}
    for r in range(reps + 1):
        for flag in (False, True):
            t0 = time.perf_counter()
            with autocast(policy, flag):
                policy.logits(policy.forward_full(tokens)).float().logsumexp(-1).mean().backward()
            if tokens.is_cuda:  # kernels run asynchronously there: time them, not their launch
                torch.cuda.synchronize()
            if r:  # the first round warms up both paths
                times[flag].append(time.perf_counter() - t0)
    policy.zero_grad(set_to_none=True)
    fp32, bf16 = min(times[False]), min(times[True])
    return bf16 < fp32, {"fp32_s": fp32, "bf16_s": bf16}


def autocast_choice(policy, micro_batch_size: int, seq_len: int, cache_dir: Path) -> tuple[bool, dict]:
    """bf16_autocast_is_faster's answer for this model and micro-batch on this machine: measured on first use,
    then read from cache_dir/AUTOCAST_CACHE (keyed as the dtype probe is: CPU and capability, torch, model,
    threads), so that every run on a machine decides alike and pays for the probe once. On a GPU no CPU probe
    runs: bf16, as load_model's dtype auto there."""
    if policy.embed.weight.device.type == "cuda":
        return True, "bf16 on a GPU"
    if not policy.name:  # no stable key: probed every time
        return bf16_autocast_is_faster(policy, micro_batch_size, seq_len)
    key = f"{tuning.cache_key(policy.name, policy.embed.weight.device)} | micro-batch {micro_batch_size}x{seq_len}"
    path = Path(cache_dir) / AUTOCAST_CACHE
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: probe again
        known = {}
    if key not in known:
        use_bf16, probe = bf16_autocast_is_faster(policy, micro_batch_size, seq_len)
        known[key] = {"use_bf16": use_bf16, "probe": probe}
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(known, indent=1))
    return known[key]["use_bf16"], {**known[key]["probe"], "cache": str(path)}


probe_bf16 = bf16_autocast_is_faster  # old name, kept for one release
