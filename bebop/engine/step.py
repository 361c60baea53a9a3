"""One speculative step for every decoding row at once, read top to bottom (`speculative_step`):

  1. draft   (K > 0) the draft first catches up on the positions the target committed since it last ran (from
             the target's hidden states), which yields draft 1; then it recurses on its own hidden states for
             drafts 2..K. `spec` samples x_i ~ q_i; `spec-greedy` takes x_i = argmax q_i.
  2. verify  the target scores [pending token, x_1..x_K] in one forward: p_1..p_{K+1}.
  3. accept  rejection sampling (bebop.sampling) keeps a prefix of the drafts plus one corrected/bonus token.
  4. commit  each row advances its own KV-cache length by its own count; rejected entries are simply
             overwritten later.
K = 0 is a plain decoding step: verify one token, sample from p_1. Plain steps only pile their positions up for
the draft (`Rows`), fed to it by `catch_up` when drafting resumes.
Every row draws its uniforms from its own generator, 2K + 1 per step, so with a fixed K a request's output
depends neither on the other rows nor on when it joined. Rows may verify their own numbers of drafts k_r <= K
(`draft_lens`, chosen before the step): a model drafts K for every row and row r draws 2 k_r + 1 uniforms, its
drafts past k_r being padding; a draft that is not a model (bebop.drafts.history) proposes instead of step 1,
k_r + 1 uniforms for row r.
"""

from dataclasses import dataclass

import torch

from bebop.drafts.base import Draft, target_forward
from bebop.models.decoder import Decoder
from bebop.sampling import SamplingParams, probabilities, rejection_sample_uniform, sample

NO_REQUEST = -1  # the request of an empty row


def draft(mtp: Draft, tokens, feats, count, cache, K, params, greedy, u):
    """Catch up on `count` [B] new positions per row (their tokens and the target's unprojected features, as
    target_forward returns them), then draft K tokens recursively.
    Returns draft tokens [B, K] (target vocabulary ids), the distributions to verify them against [B, K, Vd]
    (one-hot when greedy) and the MTP's own distributions [B, K, Vd], both over the draft vocabulary."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    h = mtp(tokens, mtp.features(feats), cache)[rows, count - 1]
    cache.lengths += count
    drafts, verify_q, q_own = [], [], []
    for k in range(K):
        if k > 0:  # recursion: the previous draft token with the MTP's own previous hidden state
            h = mtp(drafts[-1].unsqueeze(1), h.unsqueeze(1), cache)[:, 0]
            cache.lengths += 1
        q = probabilities(mtp.draft_logits(h), params)
        idx = q.argmax(-1) if greedy else sample(q, u[:, k])
        drafts.append(idx if len(mtp.vocab_ids) == 0 else mtp.vocab_ids[idx])
        q_own.append(q)
        verify_q.append(torch.zeros_like(q).scatter_(-1, idx.unsqueeze(-1), 1.0) if greedy else q)
    cache.lengths -= K - 1  # speculative entries are not committed; the next catch-up overwrites them
    return torch.stack(drafts, 1), torch.stack(verify_q, 1), torch.stack(q_own, 1)


def catch_up(mtp: Draft, tokens, feats, count, cache):
    """Feed the MTP all but the last of each row's pending positions, without drafting: the positions plain
    steps (K = 0) piled up, when drafting resumes. Returns the new, one-long pile."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    mtp(tokens, mtp.features(feats), cache)
    cache.lengths += count - 1
    last = count - 1
    return tokens[rows, last].unsqueeze(1), feats[rows, last].unsqueeze(1), torch.ones_like(count)


@dataclass
class Rows:
    """What each decoding row carries from step to step; row r holds request `request[r]`. The pile is what the
    MTP has yet to see: for each position the target committed since the MTP last ran, the target's features
    there (unprojected, as target_forward returns them) and the token after it."""
    request: list[int]  # the request in each row
    gen: list[torch.Generator]  # that request's generator: every uniform it draws
    n_out: torch.Tensor  # [B] tokens emitted so far
    pending: torch.Tensor  # [B] the last emitted token, not yet seen by the target
    pile_tokens: torch.Tensor  # [B, W]
    pile_feats: torch.Tensor  # [B, W, F]
    pile_count: torch.Tensor  # [B] pile positions in use per row (W >= max)

    @classmethod
    def empty(cls, batch: int, feat_dim: int, dtype, device=None) -> "Rows":
        def zeros(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=device)
        return cls([NO_REQUEST] * batch, [None] * batch, zeros(batch), zeros(batch), zeros(batch, 1),
                   zeros(batch, 1, feat_dim, dtype=dtype), zeros(batch) + 1)

    def __len__(self) -> int:
        return len(self.request)

    def keep(self, keep: torch.Tensor) -> "Rows":
        rows = keep.tolist()
        keep = keep.to(self.pending.device)
        return Rows([self.request[r] for r in rows], [self.gen[r] for r in rows], self.n_out[keep],
                    self.pending[keep], self.pile_tokens[keep], self.pile_feats[keep], self.pile_count[keep])

    def commit_pile(self, K: int, step_tokens, feats, num_accepted, drafted: bool = True) -> None:
        """After a step: where the MTP drafted, it has seen the drafted positions and must next see the accepted
        ones; otherwise (a plain step, or drafts it did not make) the positions each row committed join the pile."""
        if K and drafted:
            self.pile_tokens, self.pile_feats, self.pile_count = step_tokens.clamp_min(0), feats, num_accepted + 1
            return
        while int(self.pile_count.max()) + K + 1 > self.pile_tokens.shape[1]:  # twice as wide, a copy each
            self.pile_tokens = torch.cat([self.pile_tokens, torch.zeros_like(self.pile_tokens)], 1)
            self.pile_feats = torch.cat([self.pile_feats, torch.zeros_like(self.pile_feats)], 1)
        # all K+1 positions are written after each row's pile (no host sync); past a row's committed ones they
        # lie beyond its count, as a drafting step's rejected positions do, and are overwritten later
        # (indexed writes, a whole feature vector each: scatter_ over an expanded index wrote element by element,
        # 1.7 s of a 13.8 s generation of 64 rows with EAGLE-3's three captured layers in bf16)
        at = self.pile_count.unsqueeze(1) + torch.arange(K + 1, device=self.pending.device)  # [B, K+1]
        rows = torch.arange(len(at), device=at.device).unsqueeze(1)  # [B, 1]
        self.pile_tokens[rows, at] = step_tokens.clamp_min(0)
        self.pile_feats[rows, at] = feats
        self.pile_count = self.pile_count + num_accepted + 1


def row_uniforms(gens: list[torch.Generator], K: int, draft_lens: torch.Tensor | None,
                 sampled: bool | list[bool] = True) -> torch.Tensor:
    """[B, 2K+1] uniforms: K to draft, K to accept, one for the last token. Every row draws from its own
    generator: 2K+1, or with a length per row (`draft_lens`) 2k_r + 1 for a model's k_r drafts and k_r + 1 for
    those of a draft that samples nothing (not `sampled`, for all rows or per row: to accept, then the last
    token), placed at the same columns (the others are 0: padding, never verified).
    The generators live on the CPU whatever the model's device, so a seed gives the same uniforms everywhere."""
    if draft_lens is None:
        return torch.stack([torch.rand(2 * K + 1, generator=g, dtype=torch.float64) for g in gens])
    u = torch.zeros(len(gens), 2 * K + 1, dtype=torch.float64)
    per_row = sampled if isinstance(sampled, list) else [sampled] * len(gens)
    for r, (g, k, sampled) in enumerate(zip(gens, draft_lens.tolist(), per_row)):
        drawn = torch.rand(2 * k + 1 if sampled else k + 1, generator=g, dtype=torch.float64)
        if sampled:
            u[r, :k], drawn = drawn[:k], drawn[k:]
        u[r, K:K + k], u[r, 2 * K] = drawn[:k], drawn[k]
    return u


def verify_probabilities(target: Decoder, hidden, params: SamplingParams, valid) -> torch.Tensor:
    """The target's p [B, T, V] from its hidden states [B, T, d]; with `valid` [B, T], the LM head and softmax
    run at the valid positions only, and p is 0 at the padding (never accepted, never sampled from)."""
    if valid is None or bool(valid.all()):
        return probabilities(target.logits(hidden), params)
    p_valid = probabilities(target.logits(hidden[valid]), params)  # [N, V]
    p = p_valid.new_zeros(*valid.shape, p_valid.shape[-1])
    p[valid] = p_valid
    return p


def speculative_step(target: Decoder, mtp: Draft | None, rows: Rows, cache, mcache, K: int, params: SamplingParams,
                     greedy: bool, vocab_ids, proposal: tuple[torch.Tensor, torch.Tensor] | None = None,
                     draft_lens: torch.Tensor | None = None,
                     history_rows: tuple[torch.Tensor, torch.Tensor] | None = None):
    """One step for every row: draft K tokens, verify them in one target forward, accept a prefix by rejection
    sampling, commit it (K = 0: a plain decoding step). Returns the step's tokens [B, K+1] (-1 past each row's
    accepted drafts and its one corrected or bonus token), num_accepted [B], the target's distributions
    p [B, K+1, V] and the MTP's own q [B, K, Vd] (None without drafts).
    draft_lens [B]: each row verifies only its first k_r <= K of the model's drafts (None: all K).
    history_rows: drafts [B, K] and a mask [B] of the rows that verify these instead of the model's drafts,
    with q one-hot (bebop.drafts.hybrid; draft_lens then gives every row's length); a one-hot q is never built
    (rejection_sample_uniform's `proposed`).
    proposal: drafts [B, K] and a draft length per row [B] from a draft that is not a model (e.g.
    bebop.drafts.history; a hybrid's step where no row takes the model's drafts), proposed with q one-hot; each
    row's drafts past its length are padding. The MTP (if any) drafts nothing: its pile takes the committed
    positions."""
    B, device = len(rows), rows.pending.device
    if proposal is not None:
        draft_lens = proposal[1]
    sampled = proposal is None if history_rows is None else (~history_rows[1]).tolist()  # rows whose drafts are q's
    u = row_uniforms(rows.gen, K, draft_lens, sampled).to(device, non_blocking=True)  # [B, 2K+1]
    if draft_lens is not None:
        draft_lens = draft_lens.to(device)
    # 1. draft: the MTP catches up on the pile, which yields draft 1, then recurses for drafts 2..K
    q_own = from_history = None  # from_history [B]: rows whose drafts were proposed, q one-hot at each
    if proposal is not None:
        drafts, verify_q = proposal[0], None  # (every row's q one-hot: no q tensor at all)
        tokens = torch.cat([rows.pending.unsqueeze(1), drafts], 1)  # [B, K+1]
    elif K:
        width = int(rows.pile_count.max())
        drafts, verify_q, q_own = draft(mtp, rows.pile_tokens[:, :width], rows.pile_feats[:, :width],
                                        rows.pile_count, mcache, K, params, greedy, u[:, :K])
        if history_rows is not None:  # these rows verify the history's drafts instead
            from_history = history_rows[1].to(device)
            drafts = torch.where(from_history[:, None], history_rows[0].to(device), drafts)
        tokens = torch.cat([rows.pending.unsqueeze(1), drafts], 1)  # [B, K+1]
    else:
        drafts = verify_q = torch.zeros(B, 0, dtype=torch.long, device=device)
        tokens = rows.pending.unsqueeze(1)  # [B, 1]
    # 2. verify: the target scores [pending, x_1..x_K] in one forward; rows of their own length verify only
    # their own drafts (the per-token work is packed: bebop.models.decoder.Packed)
    valid = None if draft_lens is None else torch.arange(K + 1, device=device) <= draft_lens.unsqueeze(1)  # [B, K+1]
    hidden, feats = target_forward(target, mtp, tokens, cache, valid)
    p = verify_probabilities(target, hidden, params, valid)
    # 3. accept
    step_tokens, num_accepted = rejection_sample_uniform(p, verify_q, drafts, u[:, K:2 * K], u[:, 2 * K],
                                                         vocab_ids, draft_lens, from_history)
    # 4. commit: each row's cache advances by its own count; rejected entries are overwritten later
    cache.lengths += num_accepted + 1
    if mtp is not None:  # (with a proposal, the MTP drafted nothing this step)
        rows.commit_pile(K, step_tokens, feats, num_accepted, drafted=proposal is None)
    rows.pending = step_tokens[torch.arange(B, device=device), num_accepted]
    return step_tokens, num_accepted, p, q_own
