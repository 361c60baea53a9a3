"""The in-process rollout worker (bebop.rl.workers.local): its copy follows the synced weights and runs the
kernels this machine's probe chose for the rollout dtype."""

import torch

from bebop.drafts.mtp import new_mtp
from bebop.models.decoder import Linear
from bebop.models.registry import load_model
from bebop.rl.sync import model_spec, mtp_state, policy_state
from bebop.rl.workers.local import LocalWorker


def test_worker_mtp_drafts_for_the_synced_weights():
    """After load_weights, the worker's MTP head (a cached slice under a reduced draft vocabulary) is the newly
    loaded policy's head, and spec rollouts still run."""
    policy, _ = load_model("tiny-qwen3", dtype="float32")  # untied head: the MTP must follow lm_head, not the embedding
    mtp = new_mtp(policy, seed=1)
    mtp.set_draft_vocab(torch.arange(0, 200, 2))
    worker = LocalWorker(model_spec(policy, mtp, "float32"), "float32", "spec", 3, 3, 1.0)
    with torch.no_grad():
        policy.lm_head.weight.add_(1.0)
    worker.load_weights(policy_state(policy), mtp_state(mtp), 5)
    assert torch.equal(worker.mtp.head_weight, policy.lm_head.weight[torch.arange(0, 200, 2)])
    assert torch.equal(worker.mtp.eh_proj.weight, mtp.eh_proj.weight)
    out = worker.generate([[1, 5, 9]], 6, seed=0)
    assert out["version"] == 5 and len(out["tokens"][0]) >= 1 and out["stats"]["drafted"] > 0


def test_rollout_worker_runs_the_kernels_probed_for_its_dtype(probed_tiny_llama):
    """The rollout copy is built bare from the policy's config: it must still run the attention kernels and
    linear kind this machine's probe chose for the rollout dtype (not the fp32 policy's, not the defaults)."""
    policy = probed_tiny_llama(["folded", "matmul"], "packed", fp32_attention=["sdpa", "matmul"])
    mtp = new_mtp(policy, seed=1)
    worker = LocalWorker(model_spec(policy, mtp, "bfloat16"), "bfloat16", "spec", 2, 2, 1.0)
    assert worker.model.attention == ("folded", "matmul") and worker.model.linear == "packed"
    assert all(m.kind == "packed" for m in worker.mtp.modules() if isinstance(m, Linear))  # the MTP multiplies alike
    assert policy.attention == ("sdpa", "sdpa") and policy.linear == "plain"  # the fp32 policy is untouched
