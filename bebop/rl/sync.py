"""Weight sync between the trainer and the rollout side: the weights to ship, the spec a worker builds its copy
from, and the check after every sync that the rollout side computes what the trainer's weights compute."""

import copy

import torch

from bebop.drafts.base import Draft
from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft, history_of, model_of
from bebop.errors import BebopError
from bebop.models import DTYPES
from bebop.models.decoder import Decoder
from bebop.models.registry import probed_compiled, probed_kernels

# The tolerance on the mean |log p_rollout - log p_trainer| per probe token after a sync. The rollout side's own
# numerics (another dtype, other kernels) cost about what rounding the trainer's weights to the rollout dtype
# costs, and that rounding gap grows as GRPO sharpens the policy; weights a sync missed cost far more. So the
# tolerance is the larger of a floor and SYNC_GAP_FACTOR times the rounding gap measured at the check.
SYNC_PROBE_TOL = {"bfloat16": 0.15, "float32": 0.01}
SYNC_GAP_FACTOR = 2.0


def policy_state(model: Decoder) -> dict[str, torch.Tensor]:
    """Weights to ship: named parameters (a tied head appears once, as the embedding)."""
    return {k: v.detach() for k, v in model.named_parameters()}


def mtp_state(mtp: Draft | HistoryDraft | HybridDraft | None) -> dict[str, torch.Tensor]:
    """The draft model's weights to ship (its vocabulary ids travel in the spec, once; a history draft has none,
    a hybrid its trained draft's)."""
    model = model_of(mtp)
    if model is None:
        return {}
    return {k: v.detach() for k, v in model.state_dict().items() if k != "vocab_ids"}


def model_spec(policy: Decoder, mtp: Draft | None, dtype: str) -> dict:
    """What a worker needs to build empty copies of the policy and MTP in `dtype` (plain, picklable data),
    with the kernels this machine's probe chose for that dtype. A history draft (alone or in a hybrid) travels as
    its state (its rollouts and calibration), which the worker keeps learning from."""
    attention, linear = probed_kernels(policy, dtype)
    model, history = model_of(mtp), history_of(mtp)
    return {"cfg": policy.cfg, "name": policy.name, "eos_ids": list(policy.eos_ids), "attention": attention,
            "linear": linear, "compiled": probed_compiled(policy, dtype), "device": str(policy.embed.weight.device),
            "mtp": None if model is None else {"config": copy.deepcopy(model.config), "vocab_ids": model.vocab_ids.tolist()},
            "history": None if history is None else history.state()}


def token_logprobs(logits: torch.Tensor, ids: list[int]) -> list[float]:
    """log p(ids[t] | ids[:t]) for t >= 1 from logits [T, V] at temperature 1."""
    logp = torch.log_softmax(logits[:-1].float(), -1)
    return logp.gather(-1, torch.tensor(ids[1:], device=logits.device).unsqueeze(-1)).squeeze(-1).tolist()


def rounding_gap(policy: Decoder, ids: torch.Tensor, probe_ids: list[int], dtype: str, gap) -> float:
    """How far rounding the trainer's weights to `dtype` alone moves the probe's log-probs (`gap` of a copy's)."""
    if policy.embed.weight.dtype == DTYPES[dtype]:
        return 0.0
    rounded = copy.deepcopy(policy).to(DTYPES[dtype])
    moved = gap(token_logprobs(rounded.logits(rounded.forward_full(ids))[0], probe_ids))
    del rounded
    return moved


@torch.no_grad()
def check_sync(worker, policy: Decoder, probe_ids: list[int], dtype: str, draft_tol: float) -> dict:
    """The rollout side's probe log-probs against the trainer's (and its draft check). A rollout engine that did
    not take the new weights stops the run with one line, instead of sampling from a policy the trainer does not
    have. Where the rollout dtype is not the trainer's, a copy of the trainer's weights in that dtype scores the
    probe too, once the error passes the floor (SYNC_PROBE_TOL): how far rounding alone moves it
    (sync_rounding_gap, None while the floor holds) raises the tolerance (SYNC_GAP_FACTOR). Within the floor the
    copy is not made (it costs more than the rest of the check)."""
    got = worker.probe(probe_ids)
    got = got if isinstance(got, list) else [got]  # (Ray: one answer per rollout worker, each checked)
    ids = torch.tensor([probe_ids], device=policy.embed.weight.device)
    want = token_logprobs(policy.logits(policy.forward_full(ids))[0], probe_ids)
    gap = lambda a: sum(abs(x - y) for x, y in zip(a, want)) / len(want)  # noqa: E731
    error = max(gap(g["logprobs"]) for g in got)
    gap_of_rounding = None
    if error > SYNC_PROBE_TOL[dtype]:  # past the floor: is rounding to the rollout dtype alone that far off?
        gap_of_rounding = rounding_gap(policy, ids, probe_ids, dtype, gap)
    tol = max(SYNC_PROBE_TOL[dtype], SYNC_GAP_FACTOR * (gap_of_rounding or 0.0))
    draft_errors = [g["draft_error"] for g in got if g["draft_error"] is not None]
    draft_error = max(draft_errors) if draft_errors else None
    if error > tol:
        raise BebopError(f"the rollout engine's weights are not the trainer's after a sync: probe log-probs differ by "
                         f"{error:.3f} nats per token (tolerance {tol:.3f} in {dtype}: the larger of "
                         f"{SYNC_PROBE_TOL[dtype]} and {SYNC_GAP_FACTOR:g}x the {gap_of_rounding:.3f} that {dtype} "
                         f"rounding alone costs the trainer's weights)")
    if draft_error is not None and draft_error > draft_tol:
        raise BebopError(f"the rollout engine's draft is not bebop's after a sync: its linears are off by "
                         f"{draft_error:.3f} (relative; tolerance {draft_tol})")
    return {"sync_probe_error": error, "sync_draft_error": draft_error, "sync_rounding_gap": gap_of_rounding}
