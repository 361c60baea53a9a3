"""MTP training on a tiny model whose distributions are sharpened (a random tiny model is near-uniform, which
would make any draft look good): training must lower the loss and raise held-out acceptance, resume exactly,
and the data / training / comparison commands must run end to end."""

import json
import shutil
from dataclasses import replace

import pytest
import torch

from bebop.training import losses
from bebop.cli import main
from bebop.training.data import make_data
from bebop.models.registry import load_model
from bebop.drafts.registry import load_mtp, new_mtp
from bebop.sampling import SamplingParams
from bebop.training.features import TargetFeatures
from bebop.training.train import TrainConfig, teacher_forced_eval, train_draft
from bebop.training.data import load_split
from bebop.errors import BebopError
from bebop.io import load_checkpoint


@pytest.fixture(scope="module")
def sharp():
    model, tok = load_model("tiny-llama", dtype="float32")
    model.lm_head.weight.data *= 5  # entropy ~2.8 nats at T=1 instead of ~5.5 (uniform)
    return model, tok


@pytest.fixture(scope="module")
def data(sharp, tmp_path_factory):
    model, tok = sharp
    out = tmp_path_factory.mktemp("data")
    make_data(model, tok, out, num_samples=48, heldout_samples=12, params=SamplingParams(1.0), max_new_tokens=24,
              batch_size=16, seed=0, model_name="tiny-llama")
    return out


def heldout_alpha(model, mtp, data_dir, K=2):
    feats = TargetFeatures(model, load_split(data_dir, "heldout"), 1.0, 384, mtp.feature_layers)
    return teacher_forced_eval(mtp, feats, K, 1.0)


def test_training_lowers_loss_and_raises_heldout_acceptance(sharp, data, tmp_path):
    model, _ = sharp
    before = heldout_alpha(model, new_mtp(model, seed=0), data)
    cfg = TrainConfig(loss="e2e-tv", draft_len=2, steps=40, batch_size=8, lr=3e-3, eval_every=40, save_every=40,
                      eval_prompts=2, eval_new_tokens=8, features_dtype="float32", autocast="off")
    mtp = train_draft(model, data, tmp_path / "m", cfg, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "m.metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 40
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < first - 0.02, (first, last)
    after = heldout_alpha(model, mtp, data)
    assert after["heldout_alpha"][0] > before["heldout_alpha"][0] + 0.03, (before, after)
    assert after["heldout_expected_accepted"] > before["heldout_expected_accepted"]
    assert rows[-1]["spec_acceptance_rate"] is not None  # the engine's real acceptance was measured
    saved = load_mtp(tmp_path / "m", model)
    assert saved.config.meta["loss"] == "e2e-tv" and saved.config.meta["step"] == 40


def test_a_two_block_eagle3_mtp_trains_in_bf16_and_reports_per_kind(sharp, data, tmp_path):
    """The capacity options train (bf16 features and autocast, as the CLI picks on a CPU that runs bf16 fast),
    and the checkpoint carries its architecture to `--mtp`."""
    model, _ = sharp
    # (16 steps of 4 sequences: where bf16 is emulated, as on an AVX2-only CPU, a step costs ~1 s)
    cfg = TrainConfig(loss="kl+e2e-tv", draft_len=2, steps=16, batch_size=4, lr=3e-3, eval_every=16, save_every=16,
                      eval_prompts=2, eval_new_tokens=8, mtp_layers=2, feature_layers=(0, -1),
                      features_dtype="bfloat16", autocast="bf16")
    train_draft(model, data, tmp_path / "m", cfg, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "m.metrics.jsonl").read_text().splitlines()]
    assert all(r["bf16"] for r in rows)
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < first, (first, last)
    assert set(rows[-1]["heldout_alpha_by_kind"]) == {"chat", "math", "code"}
    mtp = load_mtp(tmp_path / "m", model)
    assert (mtp.config.layers, mtp.feature_layers) == (2, (0, 1))
    with pytest.raises(BebopError, match="--mtp-layers"):  # --init must name the architecture it starts from
        train_draft(model, data, tmp_path / "again", replace(cfg, steps=2, mtp_layers=1, feature_layers=()),
                  init=str(tmp_path / "m"), progress=False)


def test_resume_after_a_crash_equals_an_uninterrupted_run(sharp, data, tmp_path, monkeypatch):
    model, _ = sharp
    cfg = TrainConfig(loss="kl+e2e-tv", draft_len=2, steps=12, batch_size=8, lr=3e-3, eval_every=100,
                      save_every=5, eval_prompts=0, draft_vocab=64, features_dtype="float32", autocast="off")
    whole = train_draft(model, data, tmp_path / "whole", cfg, progress=False)

    calls = {"n": 0}
    real = losses.e2e_tv_loss

    def crash_on_9th_step(*a, **k):  # steps 0-5 use KL, e2e-tv from step 6; crash at step 8
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(losses, "e2e_tv_loss", crash_on_9th_step)
    with pytest.raises(KeyboardInterrupt):
        train_draft(model, data, tmp_path / "crashed", cfg, progress=False)
    monkeypatch.setattr(losses, "e2e_tv_loss", real)
    assert load_mtp(tmp_path / "crashed", model).config.meta["step"] == 5
    resumed = train_draft(model, data, tmp_path / "crashed", cfg, resume=True, progress=False)
    for (k, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    steps = [json.loads(x)["step"] for x in (tmp_path / "crashed.metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))
    assert len(resumed.vocab_ids) == 64


def test_commands_end_to_end(tmp_path, capsys):
    data = tmp_path / "data"
    main(["make-data", "--model", "tiny-qwen3", "--num-samples", "12", "--heldout-samples", "4",
          "--max-new-tokens", "10", "--temperature", "1.0", "--out", str(data)])
    assert len(load_split(data, "train")) == 12 and len(load_split(data, "heldout")) == 4
    main(["train-draft", "--model", "tiny-qwen3", "--data", str(data), "--loss", "lk", "--draft-len", "2",
          "--steps", "4", "--batch-size", "4", "--eval-every", "2", "--eval-prompts", "2", "--out",
          str(tmp_path / "mtp")])
    assert (tmp_path / "mtp.safetensors").exists() and (tmp_path / "mtp.json").exists()
    compare = ["compare-losses", "--model", "tiny-qwen3", "--data", str(data), "--losses", "ce,e2e-tv,kl+e2e-tv",
               "--draft-len", "2", "--steps", "2", "--batch-size", "4", "--eval-prompts", "0", "--final-eval-prompts", "2",
               "--max-new-tokens", "6", "--temperatures", "0.6,1.2", "--out", str(tmp_path / "cmp")]
    main(compare)
    evals = sorted((tmp_path / "cmp").glob("eval-*.json"))
    written = [p.stat().st_mtime_ns for p in evals]
    main(compare)  # a rerun (e.g. after a crash) reuses the finished runs and their evaluations
    assert len(evals) == 3 and [p.stat().st_mtime_ns for p in evals] == written
    report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    keys = {(r["loss"], r["temperature"], r["mode"]) for r in report["results"]}
    assert keys == {(l, t, m) for l in ("ce", "e2e-tv", "kl+e2e-tv") for t in (0.6, 1.2) for m in ("spec", "spec-greedy")}
    assert set(report["teacher_forced"]) == {"ce", "e2e-tv", "kl+e2e-tv"}
    assert all(len(tf["alpha"]) == 2 for tf in report["teacher_forced"].values())
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000
    assert "| e2e-tv | 1.2 | spec |" in (tmp_path / "cmp" / "compare.md").read_text()
    main(["analyze", "entropy", "--model", "tiny-qwen3", "--draft", str(tmp_path / "mtp"), "--temperatures",
          "0.5,1.5", "--num-prompts", "2", "--max-new-tokens", "6", "--bootstrap", "50", "--out",
          str(tmp_path / "ent")])
    for name in ("report.md", "report.json", "tokens.csv", "acceptance_vs_entropy.png"):
        assert (tmp_path / "ent" / name).stat().st_size > 0


def test_losses_compared_over_seeds_train_a_draft_per_seed_and_compare_seed_means(sharp, data, tmp_path):
    """--seeds: every loss trained from each seed (different drafts), each measure's seed mean with its interval,
    each loss against the first with Welch's interval; more seeds later train only the new ones."""
    from safetensors.torch import load_file

    from bebop.studies.compare_losses import compare_losses

    model, _ = sharp
    cfg = TrainConfig(draft_len=2, steps=3, batch_size=4, eval_every=3, eval_prompts=0, features_dtype="float32",
                      autocast="off", seed=5)
    kw = dict(temperatures=(1.0,), eval_prompts=2, eval_new_tokens=6)
    report = compare_losses(model, data, ["e2e-tv", "ce"], cfg, tmp_path, seeds=2, **kw)
    runs = {"e2e-tv": 5, "e2e-tv-seed6": 6, "ce": 5, "ce-seed6": 6}
    assert {k: v["seed"] for k, v in report["teacher_forced"].items()} == runs
    first, second = (load_file(tmp_path / f"mtp-{r}.safetensors") for r in ("ce", "ce-seed6"))
    assert any(not torch.equal(first[k], second[k]) for k in first)  # another seed, another draft
    rows = {(r["measure"], r["loss"]): r for r in report["over_seeds"]}
    measures = {"teacher-forced mean acceptance length", "teacher-forced alpha at depth 1",
                "teacher-forced alpha at depth 2", "mean acceptance length, T=1"}
    assert {m for m, _ in rows} == measures and all(len(r["values"]) == 2 for r in rows.values())
    tf = rows[("teacher-forced mean acceptance length", "ce")]
    assert tf["values"] == [1 + report["teacher_forced"][r]["expected_accepted"] for r in ("ce", "ce-seed6")]
    assert tf["ci95"][0] < tf["mean"] < tf["ci95"][1]
    e2e = rows[("teacher-forced mean acceptance length", "e2e-tv")]
    assert "minus_first" not in e2e and tf["minus_first"] == pytest.approx(tf["mean"] - e2e["mean"])
    low, high = tf["minus_first_ci95"]
    assert low < tf["minus_first"] < high
    # paired by seed: the interval of the per-seed differences, which Welch's (of two unpaired samples) is not
    per_seed = [a - b for a, b in zip(tf["values"], e2e["values"])]
    low, high = tf["minus_first_paired_ci95"]
    assert low < sum(per_seed) / 2 < high
    assert high - low == pytest.approx(2 * 12.706 * abs(per_seed[0] - per_seed[1]) / 2, rel=1e-3)
    assert "| teacher-forced mean acceptance length | ce |" in (tmp_path / "compare.md").read_text()
    written = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("eval-*.json")}
    report = compare_losses(model, data, ["e2e-tv", "ce"], cfg, tmp_path, seeds=3, **kw)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("eval-*.json") if p.name in written} == written
    assert len(list(tmp_path.glob("eval-*.json"))) == 6
    assert all(len(r["values"]) == 3 for r in report["over_seeds"])


def test_a_comparison_goes_on_elsewhere_from_its_kept_files_without_the_drafts(sharp, data, tmp_path):
    """--keep: each finished draft's evaluation and metrics are copied out as it finishes; a comparison on an empty
    output directory reads them back and trains only the seeds that were not kept, and its report is the one an
    uninterrupted comparison writes."""
    from bebop.studies.compare_losses import compare_losses

    model, _ = sharp
    cfg = TrainConfig(draft_len=2, steps=3, batch_size=4, eval_every=3, eval_prompts=0, features_dtype="float32",
                      autocast="off", seed=5)
    kw = dict(temperatures=(1.0,), eval_prompts=2, eval_new_tokens=6)
    keep = tmp_path / "kept"
    compare_losses(model, data, ["e2e-tv", "ce"], cfg, tmp_path / "here", seeds=1, keep=keep, **kw)
    assert sorted(p.name for p in keep.iterdir()) == ["eval-ce.json", "eval-e2e-tv.json", "mtp-ce.metrics.jsonl.gz",
                                                      "mtp-e2e-tv.metrics.jsonl.gz"]
    elsewhere = tmp_path / "elsewhere"  # another machine: the kept files only
    report = compare_losses(model, data, ["e2e-tv", "ce"], cfg, elsewhere, seeds=2, keep=keep, **kw)
    assert sorted(p.stem for p in elsewhere.glob("*.safetensors")) == ["mtp-ce-seed6", "mtp-e2e-tv-seed6"]
    assert len(list(keep.glob("eval-*.json"))) == 4
    whole = compare_losses(model, data, ["e2e-tv", "ce"], cfg, tmp_path / "whole", seeds=2, **kw)
    assert report["results"] == whole["results"] and report["teacher_forced"] == whole["teacher_forced"]


def test_resume_refuses_other_data_other_settings_or_nothing(sharp, data, tmp_path):
    model, _ = sharp
    cfg = TrainConfig(loss="kl", draft_len=2, steps=2, batch_size=4, eval_every=100, save_every=1, eval_prompts=0,
                      features_dtype="float32", autocast="off")
    with pytest.raises(BebopError, match="nothing to resume"):
        train_draft(model, data, tmp_path / "m", cfg, resume=True, progress=False)
    train_draft(model, data, tmp_path / "m", cfg, progress=False)
    with pytest.raises(BebopError, match="already holds a training run"):
        train_draft(model, data, tmp_path / "m", cfg, progress=False)
    with pytest.raises(BebopError, match="settings: lr"):
        train_draft(model, data, tmp_path / "m", replace(cfg, lr=1e-2), resume=True, progress=False)
    other = tmp_path / "other"
    shutil.copytree(data, other)
    with open(other / "train.jsonl", "a") as f:  # one more sequence: other data, same meta.json
        f.write((other / "train.jsonl").read_text().splitlines()[0] + "\n")
    with pytest.raises(BebopError, match="other data"):
        train_draft(model, other, tmp_path / "m", cfg, resume=True, progress=False)
    shutil.copytree(data, tmp_path / "moved")  # the same bytes elsewhere are the same data
    train_draft(model, tmp_path / "moved", tmp_path / "m", cfg, resume=True, progress=False)
    meta_path = load_checkpoint(tmp_path / "m.ckpt").path / "meta.json"  # as saved before `arch` became `kind`
    meta = json.loads(meta_path.read_text())
    meta["identity"]["config"]["arch"] = meta["identity"]["config"].pop("kind")
    meta_path.write_text(json.dumps(meta))
    train_draft(model, data, tmp_path / "m", cfg, resume=True, progress=False)


def test_the_old_name_of_the_draft_kind_still_configures_it_with_a_warning():
    with pytest.warns(DeprecationWarning, match=r"TrainConfig\(kind=...\)"):
        assert TrainConfig(arch="eagle3") == TrainConfig(kind="eagle3")


def test_a_torn_mtp_pair_is_refused(sharp, tmp_path):
    model, _ = sharp
    mtp = new_mtp(model)
    mtp.save(tmp_path / "a", step=1)
    first = (tmp_path / "a.json").read_text()
    mtp.save(tmp_path / "a", step=2)
    assert load_mtp(tmp_path / "a", model).config.meta["step"] == 2
    (tmp_path / "a.json").write_text(first)  # a crash between the two renames of a save
    with pytest.raises(BebopError, match="different saves"):
        load_mtp(tmp_path / "a", model)


def test_an_eagle3_draft_trains_exports_and_fine_tunes_from_its_export(sharp, data, tmp_path):
    """--kind eagle3: the same losses and feature cache train it (loss down, held-out acceptance up from the
    fresh draft), its checkpoint loads as an EAGLE-3 draft, and its export is a valid --init (a user's
    SpecForge draft fine-tuned with e2e-TV)."""
    from bebop.drafts.eagle3 import Eagle3, new_eagle3
    from bebop.drafts.formats import export_eagle3

    model, _ = sharp
    before = heldout_alpha(model, new_eagle3(model, seed=0), data)
    cfg = TrainConfig(kind="eagle3", loss="kl+e2e-tv", draft_len=2, steps=40, batch_size=8, lr=3e-3, eval_every=40,
                      save_every=40, eval_prompts=2, eval_new_tokens=8, draft_vocab=128,
                      features_dtype="float32", autocast="off")
    draft = train_draft(model, data, tmp_path / "e3", cfg, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "e3.metrics.jsonl").read_text().splitlines()]
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < first - 0.02, (first, last)
    after = heldout_alpha(model, draft, data)
    assert after["heldout_alpha"][0] > before["heldout_alpha"][0] + 0.03, (before, after)
    saved = load_mtp(tmp_path / "e3", model)
    assert isinstance(saved, Eagle3) and len(saved.vocab_ids) == 128 and saved.feature_layers == (-1, 0, 1)
    export_eagle3(saved, tmp_path / "dir")
    tuned = train_draft(model, data, tmp_path / "tuned", replace(cfg, steps=2, loss="e2e-tv", draft_vocab=0),
                      init=str(tmp_path / "dir"), progress=False)
    assert isinstance(tuned, Eagle3) and torch.equal(tuned.vocab_ids, saved.vocab_ids)
    new_mtp(model).save(tmp_path / "mtp")
    with pytest.raises(BebopError, match="--kind"):  # a DeepSeek-layout --init is not an EAGLE-3 start
        train_draft(model, data, tmp_path / "wrong", replace(cfg, steps=2), init=str(tmp_path / "mtp"), progress=False)
