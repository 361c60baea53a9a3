"""vLLM as the rollout engine of `bebop rl` (bebop.backends.vllm.worker) on a tiny Llama saved as a Hugging Face
directory, fp32 on both sides, with a seeded EAGLE-3 draft: the sync writes the trainer's weights into vLLM (and
the check after it catches weights that are not the trainer's), rollouts come back in bebop's plain-data
schema with the log-probs the trainer computes, a GRPO step on them moves the policy as on bebop's own
rollouts, and a run with the vLLM backend writes bebop's metrics schema. One vLLM worker for the module."""

import copy
import importlib.util
import json

import pytest
import torch

from bebop.drafts.eagle3 import new_eagle3
from bebop.errors import BebopError
from bebop.models.registry import chat_ids, load_model
from bebop.rl import grpo
from bebop.rl.config import RLConfig
from bebop.rl.loop import run_rl
from bebop.rl.sync import check_sync, mtp_state, policy_state, token_logprobs
from bebop.rl.workers.process import WorkerProcess
from bebop.rl.trainer import Sample, completion_logps, pack, policy_step
from bebop.backends.vllm.worker import DRAFT_CHECK_TOL, vllm_args, vllm_name

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed here (make test installs bebop[vllm])"),
              pytest.mark.timeout(600)]
PROMPTS = ["add 2 and 3", "name a fruit", "say hi", "count to 4"]


@pytest.fixture(scope="module")
def model_dir(vllm_model_dir):
    return vllm_model_dir


def config(model_dir, **kw):
    base = dict(model=model_dir, steps=2, prompts_per_step=2, num_generations=2, max_completion_length=12,
                learning_rate=1e-3, micro_batch_size=4, autocast="off", rollout="spec", rollout_backend="vllm",
                draft_len=2, rollout_dtype="float32", eval_prompts=2, threads=1)
    return RLConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def setup(model_dir, tmp_path_factory):
    policy, tok = load_model(model_dir, dtype="float32")
    draft = new_eagle3(policy, seed=1)
    cfg = config(model_dir)
    worker = WorkerProcess(policy, draft, cfg, "float32", 1, vllm_args(cfg, draft, tmp_path_factory.mktemp("run"), 512))
    worker.load_weights(policy_state(policy), mtp_state(draft), 0)
    yield policy, draft, tok, worker
    worker.close()


def test_vllm_names_cover_policy_and_draft():
    assert vllm_name("layers.3.wqkv.weight") == "model.layers.3.self_attn.qkv_proj.weight"
    assert vllm_name("layers.0.w13.weight") == "model.layers.0.mlp.gate_up_proj.weight"
    assert vllm_name("embed.weight") == "model.embed_tokens.weight"
    assert vllm_name("blocks.0.w2.weight") == "model.layers.0.mlp.down_proj.weight"
    assert vllm_name("hnorm.weight") == "model.layers.0.hidden_norm.weight"
    assert vllm_name("fc.weight") == "model.fc.weight"


def test_sync_check_passes_after_a_sync_and_catches_weights_not_synced(setup, perturbed):
    policy, draft, tok, worker = setup
    probe = chat_ids(tok, PROMPTS[0]) + chat_ids(tok, PROMPTS[1])
    ok = check_sync(worker, policy, probe, "float32", DRAFT_CHECK_TOL)
    assert ok["sync_probe_error"] < 1e-3 and ok["sync_draft_error"] < 1e-3  # fp32 both sides
    moved = perturbed(policy)  # the trainer's weights after updates vLLM has not received
    with pytest.raises(BebopError, match="not the trainer's"):
        check_sync(worker, moved, probe, "float32", DRAFT_CHECK_TOL)
    new_draft = copy.deepcopy(draft)
    with torch.no_grad():
        new_draft.fc.weight.mul_(1.5)
    try:
        worker.load_weights(policy_state(moved), mtp_state(new_draft), 1)  # in place, the draft with it (online)
        after = check_sync(worker, moved, probe, "float32", DRAFT_CHECK_TOL)
        assert after["sync_probe_error"] < 1e-3 and after["sync_draft_error"] < 1e-3
    finally:
        worker.load_weights(policy_state(policy), mtp_state(draft), 0)


def test_rollouts_are_bebops_schema_with_the_trainers_logprobs(setup):
    policy, draft, tok, worker = setup
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    worker.submit(prompts, 12, 5)
    got = worker.reply()
    assert set(got) == {"tokens", "logprobs", "entropies", "stats", "version", "rollout_s"}
    assert set(got["stats"]) == {"acceptance_rate", "mean_acceptance_length", "per_position_acceptance",
                                 "mean_entropy", "mean_draft_len", "drafted", "accepted", "steps", "tokens",
                                 "history_drafted", "history_accepted"}
    assert got["stats"]["drafted"] > 0 and len(got["stats"]["per_position_acceptance"]) == 2
    assert all(1 <= len(t) <= 12 for t in got["tokens"])
    assert all(t[-1] in policy.eos_ids for t in got["tokens"] if len(t) < 12)  # EOS kept, as bebop's engine keeps it
    for p, toks, lps in zip(prompts, got["tokens"], got["logprobs"]):
        with torch.no_grad():
            logits = policy.logits(policy.forward_full(torch.tensor([p + toks])))[0, len(p) - 1:]
        want = token_logprobs(logits, [p[-1]] + toks)  # the distribution sampled (T = 1), as the trainer sees it
        assert lps == pytest.approx(want, abs=1e-3)


def test_grpo_step_on_vllm_rollouts_raises_the_rewarded_logprobs(setup):
    policy, draft, tok, worker = setup
    policy = copy.deepcopy(policy).requires_grad_(True)
    rows = [chat_ids(tok, p) for p in PROMPTS[:2] for _ in range(4)]
    worker.submit(rows, 12, 3)
    got = worker.reply()
    rewards = torch.tensor([1.0, 0, 1, 0, 0, 1, 0, 0])
    adv = grpo.advantages(rewards, 4)
    samples = [Sample(p, t, lp, float(a)) for p, t, lp, a in zip(rows, got["tokens"], got["logprobs"], adv)]
    cfg = RLConfig(model="tiny-llama", learning_rate=1e-3, micro_batch_size=4, loss_type="dapo")

    def seq_logps():
        with torch.no_grad():
            lp, mask, _ = completion_logps(policy, *pack(samples, "cpu")[:3], 1.0, False)
        return (lp * mask).sum(-1)

    before = seq_logps()
    m = policy_step(policy, torch.optim.AdamW(policy.parameters(), lr=1e-3, weight_decay=0.0), samples, cfg, False)
    after = seq_logps()
    assert (after[rewards.bool()] > before[rewards.bool()]).all()
    assert (after[~rewards.bool()] < before[~rewards.bool()]).all()
    assert m["logprob_mismatch"] < 1e-3  # vLLM's processed log-probs are the trainer's (fp32 both)


class ToyTask:
    def __init__(self, prompt):
        self.prompt = prompt

    def reward(self, completion: str) -> float:
        return sum(c.isalpha() for c in completion) / max(len(completion), 1)


def test_rl_run_with_the_vllm_backend_writes_bebops_metrics_one_step_and_resumes(model_dir, tmp_path):
    """bebop's backend synchronous; vLLM's one step off-policy (one core each) for 2 steps, then resumed to 3."""
    tasks = [ToyTask(p) for p in PROMPTS]
    rows = {}
    for backend, kw in (("bebop", {}), ("vllm", {"async_mode": "one-step", "threads": 2})):
        policy, tok = load_model(model_dir, dtype="float32")
        draft = new_eagle3(policy, seed=1)
        rows[backend] = run_rl(config(model_dir, rollout_backend=backend, **kw), tmp_path / backend, policy, tok, tasks,
                               tasks[:2], draft, progress=False)
    assert set(rows["vllm"][0]) == set(rows["bebop"][0])
    assert [r["policy_version_lag"] for r in rows["vllm"]] == [0, 1]  # batch 2 came from weights 0
    policy, tok = load_model(model_dir, dtype="float32")
    resumed = run_rl(config(model_dir, async_mode="one-step", threads=2, steps=3), tmp_path / "vllm", policy, tok,
                     tasks, tasks[:2], new_eagle3(policy, seed=1), resume=True, progress=False)
    # (the run ended at step 2 with no batch in flight, so batch 3 is generated afresh, from weights 2)
    assert [r["step"] for r in resumed] == [3] and resumed[0]["rollout_policy_version"] == 2
    lines = (tmp_path / "vllm" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    for r in rows["vllm"] + resumed:
        assert r["sync_probe_error"] < 1e-3 and r["sync_draft_error"] < 1e-3 and r["sync_s"] > 0
        assert r["acceptance_rate"] is not None and r["entropy_mean"] == r["policy_entropy"] > 0
    assert (tmp_path / "vllm" / "vllm-draft" / "config.json").exists()  # the draft vLLM loaded, kept with the run
    assert json.loads((tmp_path / "vllm" / "config.json").read_text())["rollout_backend"] == "vllm"


def test_a_draft_vllm_cannot_load_is_refused_before_training(model_dir, tmp_path):
    from bebop.drafts.mtp import new_mtp

    policy, tok = load_model(model_dir, dtype="float32")
    tasks = [ToyTask(p) for p in PROMPTS]
    with pytest.raises(BebopError, match="EAGLE-3 drafts only"):
        run_rl(config(model_dir), tmp_path / "r", policy, tok, tasks, tasks[:2], new_mtp(policy), progress=False)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


@pytest.mark.parametrize("argv, message", [
    (["--rollout-backend", "sglang"], "--rollout-backend must be one of bebop, vllm"),
    (["--model", "MODEL_DIR", "--rollout-backend", "vllm"], "needs an EAGLE-3 draft"),
    (["--model", "tiny-llama", "--rollout-backend", "vllm", "--draft-len", "2"], "exists only in memory"),
    (["--model", "MODEL_DIR", "--rollout-backend", "vllm", "--draft-len", "2"], "needs an EAGLE-3 draft"),
    (["--model", "MODEL_DIR", "--rollout-backend", "vllm", "--draft-len", "2", "--draft", "random"],
     "DeepSeek-layout MTP; vLLM loads EAGLE-3 drafts only"),
])
def test_rl_cli_refuses_what_vllm_cannot_run_in_one_line(model_dir, tmp_path, capsys, argv, message):
    from bebop.cli import main

    argv = [model_dir if a == "MODEL_DIR" else a for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(["rl", *argv, "--steps", "1", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith("bebop: error:") and "\n" not in err and message in err, err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_a_stale_draft_fails_the_sync_check(setup):
    """The draft half of the check: a drafter whose linears are not bebop's (the miles #1926 failure) stops it."""
    policy, draft, tok, worker = setup

    class StaleDraft:
        def probe(self, ids):
            return {**worker.probe(ids), "draft_error": 0.7}  # what a 5%-perturbed draft measured in vLLM

    probe = chat_ids(tok, PROMPTS[0])
    with pytest.raises(BebopError, match="draft is not bebop's"):
        check_sync(StaleDraft(), policy, probe, "float32", DRAFT_CHECK_TOL)
