"""The check after every weight sync (bebop.rl.sync): it passes for the trainer's weights in the rollout dtype,
and fails for a copy the sync missed."""

import pytest
import torch

from bebop.errors import BebopError
from bebop.models import cpu
from bebop.models.decoder import Linear
from bebop.models.registry import load_model
from bebop.rl.sync import SYNC_PROBE_TOL, check_sync, model_spec, policy_state
from bebop.rl.workers.local import LocalWorker


@pytest.mark.parametrize("dtype,kind", [("bfloat16", "amx"), ("float32", "onednn")])
def test_sync_check_on_fast_linears_passes_after_each_sync_and_catches_a_stale_copy(probed_tiny_llama, dtype, kind):
    """A rollout worker multiplying with a fast kernel (vLLM's AMX bf16 GEMM; its oneDNN matmul in fp32, as on an
    AVX2-only CPU) keeps its weights in that kernel's layout: after each sync (in place, as training updates
    them) the copy must be rebuilt, so the sync check passes at every version, and a worker that did not take
    the new weights fails it."""
    from bebop.models.kernels import amx_weights, onednn_weights

    if not {"amx": amx_weights, "onednn": onednn_weights}[kind](getattr(torch, dtype), torch.device("cpu")):
        pytest.skip(f"this CPU ({cpu.describe()}) has no {kind} {dtype} linears (vLLM's kernels loaded: "
                    f"{cpu.vllm_cpu_ops()})")
    policy = probed_tiny_llama(["sdpa", "sdpa"], kind if dtype == "bfloat16" else "plain",
                               fp32_linear=kind if dtype == "float32" else "plain")
    worker = LocalWorker(model_spec(policy, None, dtype), dtype, "ar", 0, 0, 1.0)
    assert worker.model.linear == kind
    probe = list(range(3, 40))
    for version in range(3):
        worker.load_weights(policy_state(policy), {}, version)
        assert check_sync(worker, policy, probe, dtype, float("inf"))["sync_probe_error"] < SYNC_PROBE_TOL[dtype]
        assert kind in worker.model.layers[0].w13.__dict__["_packed"]  # the fast copy is what the check ran
        with torch.no_grad():  # a training step: the trainer's weights move in place
            for p in policy.parameters():
                p.add_(0.05 * torch.randn_like(p))
    with pytest.raises(BebopError, match="not the trainer's"):  # the last update was never synced
        check_sync(worker, policy, probe, dtype, float("inf"))
    assert all(m.kind == kind for m in worker.model.modules() if isinstance(m, Linear))


def test_the_sync_check_allows_what_bf16_rounding_costs_a_sharp_policy_and_catches_a_missed_sync(perturbed):
    """As GRPO sharpens the policy, a bf16 engine's probe log-probs move away from the
    fp32 trainer's by bf16 rounding alone (0.05 -> 0.14 nats), and a fixed 0.15 tolerance stopped a healthy run
    at step 54. The tolerance follows the rounding gap measured on the trainer's own weights: a sharp policy
    (logits x128) whose engine is off by more than 0.15 passes, and weights the sync missed still fail. Within
    the floor the rounded copy is never made (sync_rounding_gap None)."""
    policy, _ = load_model("tiny-llama", dtype="float32")
    worker = LocalWorker(model_spec(policy, None, "bfloat16"), "bfloat16", "ar", 0, 0, 1.0)
    worker.load_weights(policy_state(policy), {}, 0)
    calm = check_sync(worker, policy, list(range(3, 40)), "bfloat16", float("inf"))
    assert calm["sync_probe_error"] <= SYNC_PROBE_TOL["bfloat16"] and calm["sync_rounding_gap"] is None
    with torch.no_grad():
        policy.norm.weight.mul_(128.0)  # the logits scale with the final norm's weight
    worker = LocalWorker(model_spec(policy, None, "bfloat16"), "bfloat16", "ar", 0, 0, 1.0)
    worker.load_weights(policy_state(policy), {}, 0)
    probe = list(range(3, 40))
    ok = check_sync(worker, policy, probe, "bfloat16", float("inf"))
    assert ok["sync_probe_error"] > SYNC_PROBE_TOL["bfloat16"]  # the old fixed tolerance would have stopped here
    assert ok["sync_rounding_gap"] == pytest.approx(ok["sync_probe_error"], rel=0.5)
    with pytest.raises(BebopError, match="not the trainer's"):
        check_sync(worker, perturbed(policy), probe, "bfloat16", float("inf"))


def test_a_hybrid_drafts_trained_draft_reaches_the_worker_and_a_stale_copy_shows(tiny_llama):
    """--draft hybrid: the worker builds the hybrid from the spec (the trained draft and the history's state),
    and a sync copies the trained draft's weights into it; a draft changed after the sync differs there."""
    from bebop.drafts.history import HistoryDraft
    from bebop.drafts.hybrid import HybridDraft
    from bebop.drafts.mtp import new_mtp
    from bebop.rl.sync import mtp_state

    policy = tiny_llama[0]
    history = HistoryDraft()
    history.add([1, 2, 3], [4, 5, 6])
    hybrid = HybridDraft(new_mtp(policy, seed=1), history)
    worker = LocalWorker(model_spec(policy, hybrid, "float32"), "float32", "spec", 2, 3, 1.0)
    assert isinstance(worker.mtp, HybridDraft) and worker.draft_state() == history.state()
    worker.load_weights(policy_state(policy), mtp_state(hybrid), 1)
    theirs = worker.mtp.model.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in hybrid.model.state_dict().items())
    with torch.no_grad():
        next(hybrid.model.parameters()).add_(0.1)  # trained after the sync: the worker's copy is stale
    assert not all(torch.equal(v, theirs[k]) for k, v in hybrid.model.state_dict().items())
