"""The RL loop on tiny-llama: off vs one-step (policy version lag, same metrics schema, MTP sync), exact resume."""

import json

import pytest
import torch

import bebop.engine.generation as generation
from bebop import io
from bebop.drafts.history import HistoryDraft
from bebop.drafts.hybrid import HybridDraft
from bebop.errors import BebopError
from bebop.models.registry import load_model
from bebop.drafts.mtp import new_mtp
from bebop.rl.config import RLConfig
from bebop.rl.loop import run_rl
from rl_helpers import EVAL, TRAIN




def small(**kw):
    base = dict(model="tiny-llama", steps=3, prompts_per_step=2, num_generations=3, max_completion_length=10,
                learning_rate=1e-3, micro_batch_size=4, autocast="off", rollout="spec", draft_len=3, eval_prompts=2,
                threads=2, rollout_dtype="bfloat16")
    return RLConfig(**{**base, **kw})


def run(cfg, out, resume=False, train=TRAIN):
    policy, tok = load_model(cfg.model, dtype="float32")
    mtp = None if cfg.rollout == "ar" else HistoryDraft() if cfg.draft == "history" else \
        HybridDraft(new_mtp(policy, seed=1), HistoryDraft()) if cfg.draft == "hybrid" else new_mtp(policy, seed=1)
    rows = run_rl(cfg, out, policy, tok, train, EVAL, mtp, resume=resume, progress=False)
    return policy, rows


def test_off_and_one_step_lag_schema_and_online_mtp(tmp_path):
    _, off = run(small(async_mode="off"), tmp_path / "off")
    _, one = run(small(async_mode="one-step", draft_strategy="online-e2e-tv"), tmp_path / "one")
    assert [r["policy_version_lag"] for r in off] == [0, 0, 0]
    # one-step: batch n+1 is generated with weights n while batch n trains, so every batch after the first is
    # exactly one policy version old
    assert [r["policy_version_lag"] for r in one] == [0, 1, 1]
    assert [r["rollout_policy_version"] for r in one] == [0, 0, 1]
    lines = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    off_lines = [json.loads(x) for x in (tmp_path / "off" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and set(lines[0]) - {"mtp_loss"} == set(off_lines[0])
    for key in ("reward_mean", "reward_std", "entropy_mean", "acceptance_rate", "mean_acceptance_length",
                "per_position_acceptance", "tokens", "rollout_s", "train_s", "mtp_train_s", "sync_s", "step_s",
                "policy_version_lag", "loss", "clip_ratio", "logprob_mismatch"):
        assert key in lines[0] and key in off_lines[0]
    assert all(r["mtp_train_s"] > 0 for r in one) and all(r["mtp_train_s"] == 0 for r in off)
    assert all(0 <= r["acceptance_rate"] <= 1 for r in one + off)
    # bf16 rollouts against fp32 training: a small, logged mismatch
    assert all(0 < r["logprob_mismatch"] < 0.5 for r in off)
    evals = [json.loads(x) for x in (tmp_path / "off" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 3] and evals[0]["heldout_n"] == 2


def test_resume_equals_uninterrupted(tmp_path):
    full, rows = run(small(steps=2), tmp_path / "full")
    run(small(steps=1), tmp_path / "part")
    resumed, rows2 = run(small(steps=2), tmp_path / "part", resume=True)
    assert [r["step"] for r in rows2] == [2]
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k
    assert rows2[0]["reward_mean"] == rows[-1]["reward_mean"]
    steps = [json.loads(x)["step"] for x in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


HISTORY = dict(draft="history", num_train_prompts=2)  # two training prompts taken in turn: an epoch a step


@pytest.mark.parametrize("async_mode", ["off", "one-step"])
def test_a_history_draft_learns_over_epochs_and_is_checkpointed(tmp_path, async_mode):
    """--draft history: the worker's history (here or in its own process) learns from every training batch,
    later steps draft from it, and the checkpoint holds it, the held-out prompts apart (never learnt from)."""
    _, rows = run(small(steps=3, async_mode=async_mode, **HISTORY), tmp_path / "run", train=TRAIN[:2])
    assert rows[0]["drafted_tokens"] < rows[-1]["drafted_tokens"]  # the earlier epochs' rollouts drafted too
    saved = HistoryDraft.from_state(io.load_checkpoint(tmp_path / "run" / "ckpt").state["history"])
    assert len(saved.prompts) == 2 and all(h.size > 0 for h in saved.prompts.values())
    assert saved.calibration.counts  # the drafts' outcomes calibrated it


def test_a_history_draft_resumes_as_if_uninterrupted(tmp_path):
    """A resumed run samples what the uninterrupted one did: with a fixed draft length the drafts, and so the
    samples, follow from the history and the seeds alone, and the history came back from the checkpoint."""
    full, rows = run(small(steps=3, **HISTORY), tmp_path / "full", train=TRAIN[:2])
    run(small(steps=2, **HISTORY), tmp_path / "part", train=TRAIN[:2])  # (its last step evaluates: not learnt)
    resumed, rows2 = run(small(steps=3, **HISTORY), tmp_path / "part", resume=True, train=TRAIN[:2])
    assert [r["step"] for r in rows2] == [3]
    assert rows2[0]["reward_mean"] == rows[-1]["reward_mean"] and rows2[0]["acceptance_rate"] == rows[-1]["acceptance_rate"]
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def test_a_hybrid_draft_learns_its_history_and_resumes_as_if_uninterrupted(tmp_path, monkeypatch):
    """--draft hybrid: the trained draft and the history both draft (the metrics say how much each), the
    checkpoint holds the history, and a resumed run samples what the uninterrupted one did. (The trained draft
    promises 0.1 a depth here, so that the history's few matches on a tiny random model outbid it.)"""
    monkeypatch.setattr(generation, "MODEL_PRIOR", 0.1)
    hybrid = dict(HISTORY, draft="hybrid")
    full, rows = run(small(steps=3, **hybrid), tmp_path / "full", train=TRAIN[:2])
    assert 0 < rows[-1]["history_drafted_tokens"] < rows[-1]["drafted_tokens"]
    assert len(io.load_checkpoint(tmp_path / "full" / "ckpt").state["history"]["prompts"]) == 2
    run(small(steps=2, **hybrid), tmp_path / "part", train=TRAIN[:2])
    resumed, rows2 = run(small(steps=3, **hybrid), tmp_path / "part", resume=True, train=TRAIN[:2])
    assert rows2[0]["reward_mean"] == rows[-1]["reward_mean"] and rows2[0]["acceptance_rate"] == rows[-1]["acceptance_rate"]
    for (k, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), k


def test_resume_refuses_changed_settings(tmp_path):
    run(small(steps=1, rollout="ar"), tmp_path / "a")
    with pytest.raises(BebopError, match="settings differ.*learning_rate"):
        run(small(steps=2, rollout="ar", learning_rate=1e-4), tmp_path / "a", resume=True)
    with pytest.raises(BebopError, match="holds a run already"):  # never overwritten without --resume
        run(small(steps=1, rollout="ar"), tmp_path / "a")
    with pytest.raises(BebopError, match="no checkpoint"):
        run(small(steps=1, rollout="ar"), tmp_path / "empty", resume=True)


def test_a_run_saved_before_the_draft_fields_were_renamed_resumes(tmp_path):
    """Its config.json says mtp_learning_rate where RLConfig now says draft_learning_rate: the same setting."""
    cfg = small(steps=1, rollout="ar", draft_learning_rate=5e-4)
    run(cfg, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    config["mtp_learning_rate"] = config.pop("draft_learning_rate")
    (tmp_path / "a" / "config.json").write_text(json.dumps(config))
    _, rows = run(small(steps=2, rollout="ar", draft_learning_rate=5e-4), tmp_path / "a", resume=True)
    assert [r["step"] for r in rows] == [2]


@pytest.mark.parametrize("change,message", [
    (dict(num_generations=1), "--num-generations must be >= 2"),
    (dict(loss_type="ppo"), "--loss-type must be one of"),
    (dict(epsilon=-0.1), "--epsilon must be >= 0"),
    (dict(rollout="ar", draft_strategy="online-kl"), "needs a speculative --rollout"),
    (dict(async_mode="one-step", threads=1), "needs --threads >= 2"),
    (dict(draft_len=0), "--draft-len must be >= 1 or 'auto' for --rollout spec"),
    (dict(draft_len="3"), "--draft-len must be an integer or 'auto'"),
    (dict(draft_len="auto", max_draft_len=0), "--max-draft-len must be >= 1"),
    (dict(draft_len="auto", rollout_backend="vllm"), "--rollout-backend vllm needs a fixed --draft-len"),
    (dict(draft="history", rollout_backend="vllm", draft_len=2), "--draft history drafts in bebop's engine only"),
    (dict(draft="history", draft_strategy="online-kl"), "--draft history drafts with a frozen draft only"),
    (dict(draft="hybrid", draft_strategy="online-kl"), "--draft hybrid drafts with a frozen draft only"),
    (dict(draft="history", ray="local", rollout_workers=2), "--draft history needs one rollout worker"),
    (dict(num_train_prompts=-1), "--num-train-prompts must be >= 0"),
])
def test_bad_options(change, message):
    with pytest.raises(BebopError, match=message):
        small(**change).validate()


def test_auto_draft_len_reaches_the_engine_and_bounds_the_online_training_depth(tmp_path, monkeypatch):
    """--draft-len auto: rollouts ask the engine for auto K up to --max-draft-len, each step logs the K it drafted
    on average, and an online MTP strategy trains to that most (a fixed K trains to K)."""
    import bebop.rl.workers.local as local

    asked = []

    def spy(*args, **kw):
        asked.append((kw["draft_len"], kw["max_draft_len"]))
        return generate(*args, **kw)

    generate = local.generate
    monkeypatch.setattr(local, "generate", spy)
    cfg = small(steps=1, draft_len="auto", max_draft_len=2, draft_strategy="online-e2e-tv")
    _, rows = run(cfg, tmp_path / "auto")
    assert asked and set(asked) == {("auto", 2)}
    assert "mean_draft_len" in rows[0] and (rows[0]["mean_draft_len"] is None or 0 < rows[0]["mean_draft_len"] <= 2)
    assert cfg.draft_depth == 2 and small(draft_len=3).draft_depth == 3


def test_online_mtp_with_feature_layers_trains_and_syncs(tmp_path):
    """An EAGLE-3 MTP (reading captured target layers) trains online on the policy's features, and the
    one-step worker (another process, holding a copy built from the MTP's config) drafts with it."""
    cfg = small(steps=2, async_mode="one-step", draft_strategy="online-kl")
    policy, tok = load_model(cfg.model, dtype="float32")
    mtp = new_mtp(policy, seed=1, feature_layers=(0, 1))
    before = {k: v.clone() for k, v in mtp.state_dict().items()}
    rows = run_rl(cfg, tmp_path / "run", policy, tok, TRAIN, EVAL, mtp, progress=False)
    assert all(r["mtp_train_s"] > 0 and r["acceptance_rate"] is not None for r in rows)
    after = mtp.state_dict()
    assert not torch.equal(before["fc.weight"], after["fc.weight"])
    assert not torch.equal(before["eh_proj.weight"], after["eh_proj.weight"])


def test_rollout_dtype_auto_is_the_probes_choice_and_kept_on_resume(tmp_path):
    """--rollout-dtype auto (the default) rolls out in the dtype --dtype auto picks: fp32 for the seeded test
    models, which are never probed. run.json records it with the machine, and a resumed run keeps it."""
    cfg = small(steps=1, rollout_dtype="auto", async_mode="off")
    _, rows = run(cfg, tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["rollout_dtype"] == "float32"
    from bebop.models import cpu  # and where it ran: the machine's CPU and what it can run, the kernels
    assert (meta["cpu"], meta["cpu_capability"]) == (cpu.cpu_model(), cpu.describe())
    assert meta["rollout_linear"] == "plain" and len(meta["rollout_attention"]) == 2
    assert rows[0]["logprob_mismatch"] < 1e-4  # fp32 rollouts, fp32 training: the same numbers
    meta["rollout_dtype"] = "bfloat16"  # as if the probe had chosen bf16 when the run started
    (tmp_path / "run" / "run.json").write_text(json.dumps(meta))
    _, more = run(small(steps=2, rollout_dtype="auto", async_mode="off"), tmp_path / "run", resume=True)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["rollout_dtype"] == "bfloat16"
    assert more[-1]["logprob_mismatch"] > 1e-4  # the resumed run rolled out in bf16, as recorded
