"""Draft training on an accelerator (the `accelerator` fixture: CUDA where torch sees a GPU; skipped with a reason
elsewhere, or run on the CPU with BEBOP_TEST_DEVICES=cpu): self-distillation data made there, and a draft trained
there that lowers its loss and ends on the device."""

import json

import torch

from bebop.drafts.registry import new_mtp
from bebop.models.registry import load_model
from bebop.sampling import SamplingParams
from bebop.training.data import make_data
from bebop.training.train import TrainConfig, train_draft


def test_a_draft_trains_on_the_device(accelerator, tmp_path):
    model, tok = load_model("tiny-llama", dtype="float32", device=accelerator)
    model.lm_head.weight.data *= 5  # entropy ~2.8 nats at T=1 instead of ~5.5 (uniform)
    assert model.embed.weight.device.type == accelerator.type
    make_data(model, tok, tmp_path / "data", num_samples=32, heldout_samples=8, params=SamplingParams(1.0),
              max_new_tokens=24, batch_size=16, seed=0, model_name="tiny-llama")
    cfg = TrainConfig(loss="e2e-tv", draft_len=2, steps=30, batch_size=8, lr=3e-3, eval_every=30, save_every=30,
                      eval_prompts=2, eval_new_tokens=8, features_dtype="float32", autocast="off")
    mtp = train_draft(model, tmp_path / "data", tmp_path / "m", cfg, progress=False)
    assert mtp.eh_proj.weight.device.type == accelerator.type
    rows = [json.loads(x) for x in (tmp_path / "m.metrics.jsonl").read_text().splitlines()]
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert torch.isfinite(torch.tensor(last)) and last < first - 0.02, (first, last)
    assert rows[-1]["spec_acceptance_rate"] is not None  # the engine drafted with it on the device
    assert new_mtp(model, seed=0).eh_proj.weight.device.type == accelerator.type
