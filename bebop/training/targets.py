"""What the draft is trained against: the draft unrolled on the target's features and lined up, per anchor and
depth, with the target's teacher distribution, the label token and the validity mask (`depth_tensors`), and the
bf16 autocast the training steps (draft training and RL) may run under (`autocast`).
"""

import contextlib

import torch

from bebop.drafts.base import Draft

NOT_IN_DRAFT_VOCAB = -1  # the draft index of a token outside a reduced draft vocabulary


def autocast(model, enabled: bool):
    """bf16 autocast on `model`'s device when `enabled`, else nothing."""
    device = model.embed.weight.device.type
    return torch.autocast(device, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def depth_tensors(mtp: Draft, tokens, lens, prompt_lens, hidden, lse, captured, K, T):
    """Unroll the MTP on the target's features (`hidden`, its last hidden state, or the `captured` layers of an
    EAGLE-3 MTP) and line up, per anchor t and depth k: q_k (probabilities and logits over the draft
    vocabulary), the teacher p at position t + k over the same vocabulary, the label token t + k + 1 (as a
    draft-vocabulary index, -1 if outside), and the validity mask. Shapes [N, K, V'] / [N, K]."""
    B, S = tokens.shape
    A = S - 1  # anchors t = 0..S-2
    target = mtp.target
    head = mtp.head_weight
    with torch.no_grad():  # teacher: exp(logits / T - logsumexp over the FULL vocabulary) on the draft vocabulary
        p_pos = (torch.nn.functional.linear(target.norm(hidden), head) / T - lse.unsqueeze(-1)).exp()
    outs = mtp.unroll(tokens, mtp.features(hidden if captured is None else captured), K)
    t = torch.arange(A, device=tokens.device)
    q_logits, p, labels, mask = [], [], [], []
    for k in range(1, K + 1):
        h = outs[k - 1] if k - 1 < len(outs) else hidden.new_zeros(B, 0, hidden.shape[-1])
        n = h.shape[1]
        logits = mtp.draft_logits(h) / T
        q_logits.append(torch.nn.functional.pad(logits, (0, 0, 0, A - n)))
        p.append(torch.nn.functional.pad(p_pos[:, k:], (0, 0, 0, A - (S - k))))
        label_pos = (t + k + 1).clamp(max=S - 1)
        labels.append(tokens[:, label_pos])
        mask.append((t + k + 1 < lens.unsqueeze(1)) & (t + k + 1 >= prompt_lens.unsqueeze(1)) & (t < n))
    q_logits, p = torch.stack(q_logits, 2), torch.stack(p, 2)
    labels, mask = torch.stack(labels, 2), torch.stack(mask, 2)
    if len(mtp.vocab_ids):  # full token id -> draft index, -1 outside the draft vocabulary
        to_draft = torch.full((target.cfg.vocab_size,), NOT_IN_DRAFT_VOCAB, dtype=torch.long, device=tokens.device)
        to_draft[mtp.vocab_ids] = torch.arange(len(mtp.vocab_ids), device=tokens.device)
        labels = to_draft[labels]
    keep = mask[..., 0]  # anchors whose first depth is trainable
    return q_logits[keep], p[keep], labels[keep], mask[keep]
