"""bebop as TRL's GRPOTrainer rollout function, with the real TRL on tiny-llama (built in memory)."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from bebop.errors import BebopError  # noqa: E402
from bebop.integrations.trl import BebopRollout, weight_pairs  # noqa: E402
from bebop.models.decoder import Decoder, convert_hf_state_dict  # noqa: E402
from bebop.models.registry import tiny_model  # noqa: E402


class Recording(BebopRollout):
    """Checks, at every call, what only holds at that moment: the rollout side's weights against the trainer's
    current ones, and the returned log-probs against the trainer's own recomputation."""

    def __call__(self, prompts, trainer):
        out = super().__call__(prompts, trainer)
        model = trainer.model
        ours = convert_hf_state_dict(model.state_dict(), self.decoder.cfg)
        theirs = self.decoder.state_dict()
        diff = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
        head_diff = None
        if self.mtp is not None:  # the draft's head, a slice of the LM head (all of it when vocab_ids is empty)
            rows = self.mtp.vocab_ids if len(self.mtp.vocab_ids) else slice(None)
            head_diff = (self.mtp.head_weight - self.decoder.lm_head.weight[rows]).abs().max().item()
        # the trainer's recomputation of the first sample's per-token log-probs (log_softmax(logits / T))
        prompt, completion = out["prompt_ids"][0], out["completion_ids"][0]
        input_ids = torch.tensor([prompt + completion])
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, torch.ones_like(input_ids),
                                                                  len(completion))
        self.calls.append(dict(prompts=list(prompts), out=out, step=trainer.state.global_step, weight_diff=diff,
                               head_diff=head_diff, trainer_logps=logps[0], weights=ours["layers.0.wo.weight"].clone()))
        return out


def varied_reward(completion_ids, **kwargs):
    """A reward with spread inside each group, so advantages are nonzero and a step really moves the weights."""
    return [float(sum(ids) % 7) for ids in completion_ids]


def make_trainer(hf, tok, prompts, rollout, tmp_path, steps, **config):
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, max_steps=steps, learning_rate=1e-2, report_to="none", use_cpu=True,
                      logging_steps=1, save_strategy="no", seed=3,
                      bf16=False, **config)  # fp32 training: TRL defaults to bf16 autocast, even on a CPU
    return GRPOTrainer(model=hf, reward_funcs=varied_reward, args=args, processing_class=tok,
                       train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), rollout_func=rollout)


def test_two_grpo_steps_with_speculative_rollouts_conversational(tmp_path):
    hf, tok = tiny_model("tiny-llama")
    rollout = Recording(hf, mode="spec", draft_len=3)
    rollout.calls = []
    # a reduced draft vocabulary: its head is a slice copy of the LM head, which a weight sync must refresh
    rollout.mtp.set_draft_vocab(torch.arange(0, hf.config.vocab_size, 2))
    prompts = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Say hi."}]]
    trainer = make_trainer(hf, tok, prompts, rollout, tmp_path, steps=2, temperature=0.7)
    trainer.train()

    assert [c["step"] for c in rollout.calls] == [0, 1]
    for call in rollout.calls:
        p, out = call["prompts"], call["out"]
        # TRL passes each prompt num_generations (2) times in a row; one completion per entry
        assert len(p) == 4 and p[0] == p[1] and p[2] == p[3] and p[0] != p[2]
        assert len(out["completion_ids"]) == len(out["logprobs"]) == len(out["prompt_ids"]) == 4
        assert out["prompt_ids"][0] == tok.apply_chat_template(p[0], add_generation_prompt=True, tokenize=True,
                                                               return_dict=True)["input_ids"]
        assert all(1 <= len(c) <= 8 and len(c) == len(lp) for c, lp in zip(out["completion_ids"], out["logprobs"]))
        assert 0 <= out["acceptance_rate"] <= 1 and 1 <= out["mean_acceptance_length"] <= 4
        assert len(out["per_position_acceptance"]) == 3
        assert call["weight_diff"] == 0.0 and call["head_diff"] == 0.0
        torch.testing.assert_close(torch.tensor(out["logprobs"][0]), call["trainer_logps"], atol=2e-5, rtol=0)
    # the step between the two calls moved the trainer's weights, and the rollout side followed
    assert not torch.equal(rollout.calls[0]["weights"], rollout.calls[1]["weights"])
    # TRL logged bebop's statistics and trained on bebop's completions
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for log, call in zip(logs, rollout.calls):
        assert log["bebop/acceptance_rate"] == pytest.approx(call["out"]["acceptance_rate"])
        assert log["bebop/weight_sync_time"] > 0 and log["bebop/generation_time"] > 0 and log["bebop/mean_entropy"] > 0
        lengths = [len(c) for c in call["out"]["completion_ids"]]
        assert log["completions/mean_length"] == pytest.approx(sum(lengths) / len(lengths))


def test_plain_text_prompts_in_small_batches(tmp_path):
    hf, tok = tiny_model("tiny-llama")
    rollout = Recording(hf, mode="ar", max_batch=3)
    rollout.calls = []
    prompts = ["The sky is", "Once upon a time"]
    trainer = make_trainer(hf, tok, prompts, rollout, tmp_path, steps=1)
    trainer.train()
    (call,) = rollout.calls
    out = call["out"]
    assert out["prompt_ids"] == tok(text=call["prompts"])["input_ids"]
    assert len(out["completion_ids"]) == 4 and out["acceptance_rate"] is None  # plain sampling drafts nothing
    # the two samples of one prompt are different draws (own seeds), not copies
    assert out["completion_ids"][0] != out["completion_ids"][1] or out["completion_ids"][2] != out["completion_ids"][3]
    torch.testing.assert_close(torch.tensor(out["logprobs"][0]), call["trainer_logps"], atol=2e-5, rtol=0)


@pytest.mark.parametrize("name,dtype", [("tiny-qwen3", "float32"), ("tiny-llama", "bfloat16")])
def test_weight_sync_is_exact_in_place_and_casts(name, dtype):
    hf, _ = tiny_model(name)  # tiny-qwen3 has an untied LM head, tiny-llama a tied one
    rollout = BebopRollout(hf, mode="ar", dtype=dtype)
    before = {k: v.data_ptr() for k, v in rollout.decoder.state_dict().items()}
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p))
    assert rollout.sync_weights(hf) > 0
    expected = Decoder.from_hf(hf).to(getattr(torch, dtype)).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in rollout.decoder.state_dict().items())
    assert {k: v.data_ptr() for k, v in rollout.decoder.state_dict().items()} == before  # nothing reallocated


def test_bad_input_is_a_bebop_error():
    llama, _ = tiny_model("tiny-llama")
    qwen, _ = tiny_model("tiny-qwen3")
    with pytest.raises(BebopError, match="unknown mode"):
        BebopRollout(llama, mode="fast")
    with pytest.raises(BebopError, match="max_batch"):
        BebopRollout(llama, max_batch=0)
    with pytest.raises(BebopError, match="unknown dtype"):
        BebopRollout(llama, dtype="float8")
    with pytest.raises(BebopError, match="unknown model"):
        BebopRollout("no-such-model")
    with pytest.raises(BebopError, match="does not match"):
        weight_pairs(Decoder.from_hf(llama), qwen)


def test_example_script_compares_backends(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("trl_grpo", Path(__file__).parents[2] / "examples" / "trl_grpo.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "run.json"
    example.main(["--model", "tiny-llama", "--backends", "trl,spec", "--steps", "1", "--prompts", "1",
                  "--generations", "2", "--max-new-tokens", "6", "--draft-len", "3", "--output-dir", str(tmp_path), "--json", str(out)])
    summary = json.loads(out.read_text())["summary"]
    assert summary["trl"]["rollout_time"] > 0 and summary["trl"]["bebop/acceptance_rate"] is None
    assert summary["spec"]["bebop/weight_sync_time"] > 0 and 0 <= summary["spec"]["bebop/acceptance_rate"] <= 1
    assert "spec vs trl: rollout time" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        example.main(["--backends", "vllm"])
    assert e.value.code == 2


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make test installs it)")
@pytest.mark.timeout(600)
def test_two_grpo_steps_with_vllm_generating(tmp_path, vllm_model_dir):
    """backend="vllm": vLLM generates with an EAGLE-3 draft; after each sync it holds the trainer's weights (the
    check inside the call) and its log-probs are the trainer's recomputation (fp32 both sides)."""
    from transformers import AutoModelForCausalLM

    from bebop.drafts.eagle3 import new_eagle3
    from bebop.drafts.formats import export_eagle3
    from bebop.models.registry import load_model

    policy, tok = load_model(vllm_model_dir, dtype="float32")
    draft = export_eagle3(new_eagle3(policy, seed=1), tmp_path / "draft")
    hf = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    rollout = Recording(vllm_model_dir, mode="spec", draft_len=2, dtype="float32", draft=str(draft), backend="vllm")
    rollout.calls = []
    prompts = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "Say hi."}]]
    trainer = make_trainer(hf, tok, prompts, rollout, tmp_path / "trl", steps=2, temperature=0.7)
    try:
        trainer.train()
    finally:
        rollout.close()
    assert [c["step"] for c in rollout.calls] == [0, 1]
    for call in rollout.calls:
        out = call["out"]
        assert len(out["completion_ids"]) == 4 and 0 <= out["acceptance_rate"] <= 1
        assert call["weight_diff"] == 0.0
        torch.testing.assert_close(torch.tensor(out["logprobs"][0]), call["trainer_logps"], atol=1e-3, rtol=0)
    assert not torch.equal(rollout.calls[0]["weights"], rollout.calls[1]["weights"])
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(log["bebop/weight_sync_time"] > 0 for log in logs)
