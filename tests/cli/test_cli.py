"""The command line end to end on tiny models, and its bad-input contract: one line, exit status 2."""

import json

import pytest
import torch

import bebop.engine.draft_len as autodraft
from bebop import io
from bebop.engine.draft_len import COST_FILE
from bebop.cli import main
from bebop.training.data import DEFAULT_MIX
from bebop.models.registry import load_model
from bebop.drafts.mtp import new_mtp


def run_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bebop: error:") and "\n" not in err and "Traceback" not in err, err
    return err


def test_generate_writes_jsonl(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n\n{"prompt": "2+2?"}\n')
    out = tmp_path / "out.jsonl"
    main(["generate", "--model", "tiny-llama", "--draft", "random", "--prompts", str(prompts), "--num-samples", "2", "--max-new-tokens",
          "5", "--temperature", "0.8", "--mode", "spec", "--draft-len", "2", "--seed", "3", "--output", str(out)])
    lines = sorted((json.loads(x) for x in out.read_text().splitlines()), key=lambda x: x["index"])  # finish order
    assert [x["index"] for x in lines] == [0, 1, 2, 3] and [x["prompt_index"] for x in lines] == [0, 0, 1, 1]
    assert all(1 <= len(x["tokens"]) <= 5 and isinstance(x["text"], str) for x in lines)
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["mode"] == "spec" and stats["drafted"] > 0


def test_generate_auto_draft_len_through_a_small_batch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))  # the probed cost table goes here
    probe = autodraft.probe_costs  # taken as consistent (kept on disk), as tiny steps may not come out so
    monkeypatch.setattr(autodraft, "probe_costs", lambda *a, **k: (probe(*a, **k)[0], True))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n{"prompt": "2+2?"}\n')
    out = tmp_path / "out.jsonl"
    main(["generate", "--model", "tiny-llama", "--draft", "random", "--prompts", str(prompts), "--num-samples", "3", "--max-new-tokens",
          "8", "--mode", "spec", "--max-batch", "2", "--max-draft-len", "2", "--output", str(out)])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["prompt_index"] for x in lines] == [0, 0, 0, 1, 1, 1]  # request order, though rows finish in any
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["tokens"] == sum(len(x["tokens"]) for x in lines)
    assert stats["steps"] == 0 or 0 < stats["mean_draft_len"] <= 2
    assert (tmp_path / COST_FILE).exists()


def test_generate_drafts_from_the_history_of_a_prompt(tmp_path, capsys, monkeypatch):
    """--draft history: no model; the samples of a prompt draft from each other's text as it is written, under
    auto with the probed costs of a step that drafts nothing itself."""
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    probe = autodraft.probe_costs  # taken as consistent (kept on disk), as tiny steps may not come out so
    monkeypatch.setattr(autodraft, "probe_costs", lambda *a, **k: (probe(*a, **k)[0], True))
    out = tmp_path / "out.jsonl"
    main(["generate", "--model", "tiny-qwen3", "--draft", "history", "--prompt", "hello", "--num-samples", "6",
          "--max-new-tokens", "16", "--max-batch", "2", "--temperature", "0", "--output", str(out)])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 6 and len({tuple(x["tokens"]) for x in lines}) == 1  # T = 0: one greedy answer
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["tokens"] == sum(len(x["tokens"]) for x in lines)
    assert stats["accepted"] > 0  # later samples drafted what the first ones wrote
    assert "|draft=history|batch=" in (tmp_path / COST_FILE).read_text()


def test_rl_drafts_from_the_history_over_epochs_of_a_fixed_prompt_set(tmp_path, monkeypatch):
    """bebop rl --draft history --num-train-prompts on the long-answer task: the same prompt every step, drafted
    from its earlier rollouts; the run's config and checkpoint say so."""
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    out = tmp_path / "run"
    main(["rl", "--model", "tiny-llama", "--draft", "history", "--task", "sequence", "--steps", "2",
          "--prompts-per-step", "1", "--num-train-prompts", "1", "--num-generations", "2", "--draft-len", "2",
          "--max-completion-length", "8", "--eval-prompts", "2", "--threads", "2", "--autocast", "off",
          "--out", str(out)])
    config = json.loads((out / "config.json").read_text())
    assert config["draft"] == "history" and config["num_train_prompts"] == 1 and config["task"] == "sequence"
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[-1]["drafted_tokens"] > 0
    history = io.load_checkpoint(out / "ckpt").state["history"]
    assert len(history["prompts"]) == 1  # the one training prompt; the held-out ones are not learnt from


def test_a_draft_model_command_refuses_the_history_draft(tmp_path, capsys):
    err = run_error(capsys, ["export", "--model", "tiny-llama", "--draft", "history", "--out", str(tmp_path / "x")])
    assert "--draft history drafts in generate, bench, check-exactness and rl only" in err  # (and hybrid: below)


def test_generate_drafts_from_the_trained_draft_and_the_history_per_row(tmp_path, capsys):
    """--draft hybrid: the shipped draft and a history; the later samples of a prompt draft from the earlier
    ones' text, the others from the trained draft, and the stats line says how much each drafted."""
    out = tmp_path / "out.jsonl"
    main(["generate", "--model", "smollm2-135m", "--draft", "hybrid", "--prompt", "Count to ten.", "--num-samples",
          "6", "--max-new-tokens", "24", "--max-batch", "2", "--temperature", "0", "--draft-len", "3",
          "--dtype", "float32", "--output", str(out)])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 6 and len({tuple(x["tokens"]) for x in lines}) == 1  # T = 0: one greedy answer
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert 0 < stats["history_drafted"] < stats["drafted"] and stats["history_accepted"] > 0


@pytest.mark.parametrize("argv,says", [
    (["generate", "--model", "tiny-qwen3", "--draft", "hybrid", "--prompt", "hi", "--output"], "no trained draft for 'tiny-qwen3'"),
    (["rl", "--model", "tiny-llama", "--draft", "hybrid", "--steps", "1", "--out"], "no trained draft for 'tiny-llama'"),
    (["export", "--model", "smollm2-135m", "--draft", "hybrid", "--out"], "--draft hybrid drafts in generate, bench, "
                                                                            "check-exactness and rl only")])
def test_the_hybrid_draft_is_refused_where_it_cannot_draft(tmp_path, capsys, argv, says):
    assert says in run_error(capsys, argv + [str(tmp_path / "x")])


def test_bench_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(["bench", "--model", "tiny-qwen3", "--draft", "random", "--batch-sizes", "1,2", "--modes", "ar,spec,spec-greedy,hf",
          "--draft-len", "2", "--max-new-tokens", "6", "--repeats", "1", "--dtype", "bfloat16", "--output", str(out)])
    report = json.loads(out.read_text())
    assert report["model"] == "tiny-qwen3" and report["dtype"] == "bfloat16" and report["cpu"]
    assert report["ignore_eos"] is False and report["dtype_requested"] == "bfloat16"
    rows = report["results"]
    assert {(r["mode"], r["batch_size"]) for r in rows} == {(m, b) for m in ("ar", "spec", "spec-greedy", "hf")
                                                           for b in (1, 2)}
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["temperature"] == 1.0
        if r["mode"].startswith("spec"):
            assert 0 <= r["acceptance_rate"] <= 1 and len(r["per_position_acceptance"]) == 2
            assert 1 <= r["mean_acceptance_length"] <= 3 and r["mean_entropy"] > 0
    out = capsys.readouterr().out
    assert "tok/s" in out and "dtype bfloat16" in out and f"cpu {report['cpu']}" in out


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    base = ["generate", "--model", "tiny-llama", "--draft", "random", "--prompt", "hi", "--max-new-tokens", "2"]
    assert "unknown model 'nope'" in run_error(capsys, ["generate", "--model", "nope", "--prompt", "x"])
    assert "temperature" in run_error(capsys, base + ["--temperature", "-1"])
    assert "top-p" in run_error(capsys, base + ["--top-p", "0"])
    assert "top-p" in run_error(capsys, base + ["--top-p", "1.5"])
    assert "draft-len" in run_error(capsys, base + ["--draft-len", "-1"])
    assert "max-draft-len" in run_error(capsys, base + ["--max-draft-len", "-1"])
    assert "max-batch" in run_error(capsys, base + ["--max-batch", "0"])
    assert "context" in run_error(capsys, base[:-1] + ["5000"])  # prompt + new tokens beyond the model's context
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    assert "bad.jsonl:2" in run_error(capsys, ["generate", "--model", "tiny-llama", "--prompts", str(bad)])
    other, _ = load_model("tiny-qwen3", dtype="float32")
    new_mtp(other).save(tmp_path / "qwen-mtp")
    assert "does not fit" in run_error(capsys, base + ["--draft", str(tmp_path / "qwen-mtp")])
    assert "values >= 1" in run_error(capsys, ["bench", "--model", "tiny-llama", "--batch-sizes", "0"])
    assert "unknown mode" in run_error(capsys, ["bench", "--model", "tiny-llama", "--modes", "ar,fast"])
    assert "no meta.json" in run_error(capsys, ["train-draft", "--model", "tiny-llama", "--data", str(tmp_path),
                                                  "--out", str(tmp_path / "m")])
    assert "unknown loss" in run_error(capsys, ["train-draft", "--model", "tiny-llama", "--data", str(tmp_path),
                                                "--loss", "mse", "--out", str(tmp_path / "m")])


# ----- the bad-input sweep: every kind of mistake, every command; one line, exit status 2, no traceback -----

@pytest.fixture(scope="module")
def bad(tmp_path_factory, tiny_llama, tiny_qwen3):
    """A directory of broken things to point the commands at."""
    from bebop.io import save_checkpoint

    d = tmp_path_factory.mktemp("bad")
    (d / "afile").write_text("x")
    (d / "adir").mkdir()
    (d / "one.jsonl").write_text('{"prompt": "only one"}\n')
    (d / "two.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    (d / "badjson.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')
    (d / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    (d / "empty_prompt.jsonl").write_text('{"prompt": "  "}\n')
    for name, config in (("broken_config", "{not json"), ("gpt2", '{"model_type": "gpt2"}'),
                         ("no_weights", '{"model_type": "llama"}'), ("list_config", "[1, 2]")):
        (d / name).mkdir()
        (d / name / "config.json").write_text(config)
    (d / "no_tokenizer").mkdir()
    (d / "no_tokenizer" / "config.json").write_text('{"model_type": "llama"}')
    (d / "no_tokenizer" / "model.safetensors").write_bytes(b"")
    data = d / "data"  # a well-formed make-data directory (hand-written: the sweep never trains)
    data.mkdir()
    meta = {"model": "tiny-llama", "source": "builtin", "mix": DEFAULT_MIX, "dtype": "float32", "temperature": 1.0,
            "top_p": 1.0, "top_k": 0, "max_new_tokens": 128, "seed": 0, "num_samples": {"train": 3, "heldout": 1}}
    (data / "meta.json").write_text(json.dumps(meta))
    row = json.dumps({"kind": "chat", "prompt": "p", "prompt_ids": [1, 70, 2], "completion_ids": [80, 81, 2]}) + "\n"
    (data / "train.jsonl").write_text(row * 3)
    (data / "heldout.jsonl").write_text(row)
    for name, train in (("data_badrow", '{"prompt_ids": 5}\n'), ("data_empty", ""),
                        ("data_strings", '{"prompt_ids": ["a"], "completion_ids": [1]}\n'),
                        ("data_beyond_vocab", '{"prompt_ids": [1], "completion_ids": [99999]}\n')):
        (d / name).mkdir()
        (d / name / "meta.json").write_text(json.dumps(meta))
        (d / name / "train.jsonl").write_text(train)
        (d / name / "heldout.jsonl").write_text(row)
    (d / "data_badmeta").mkdir()
    (d / "data_badmeta" / "meta.json").write_text("{")
    save_checkpoint(d / "started.ckpt", 1, {"w": torch.zeros(1)})  # a training run already under way
    mtp = new_mtp(tiny_llama[0])
    mtp.save(d / "torn")
    old = (d / "torn.json").read_text()
    mtp.save(d / "torn")
    (d / "torn.json").write_text(old)  # the weights of one save with the config of another
    new_mtp(tiny_qwen3[0]).save(d / "qwen-mtp")
    return d


GEN = ["generate", "--model", "tiny-llama", "--draft", "random", "--prompt", "hi", "--max-new-tokens", "2"]
BENCH = ["bench", "--model", "tiny-llama", "--draft", "random", "--max-new-tokens", "2", "--repeats", "1"]
DATA = ["make-data", "--model", "tiny-llama", "--num-samples", "2", "--heldout-samples", "1", "--out", "{d}/newdata"]
TRAIN = ["train-draft", "--model", "tiny-llama", "--data", "{d}/data", "--steps", "2", "--out", "{d}/m"]
CMP = ["compare-losses", "--model", "tiny-llama", "--data", "{d}/data", "--steps", "2", "--out", "{d}/cmp"]
ENT = ["analyze", "entropy", "--model", "tiny-llama", "--draft", "random", "--num-prompts", "1", "--out", "{d}/ent"]
SWEEP = [  # (arguments, what the one line must say)
    ([], "required: COMMAND"),
    (["fly"], "invalid choice"),
    (["analyze"], "required: study"),
    (GEN + ["--frobnicate"], "unrecognized arguments"),
    (["generate", "--model", "nope", "--prompt", "x"], "unknown model 'nope'"),
    (["generate", "--model", "{d}/adir", "--prompt", "x"], "no config.json"),
    (["generate", "--model", "{d}/broken_config", "--prompt", "x"], "config.json is unreadable"),
    (["generate", "--model", "{d}/list_config", "--prompt", "x"], "not a JSON object"),
    (["generate", "--model", "{d}/gpt2", "--prompt", "x"], "'gpt2'"),
    (["generate", "--model", "{d}/no_weights", "--prompt", "x"], "no weights"),
    (["generate", "--model", "{d}/no_tokenizer", "--prompt", "x"], "no tokenizer"),
    (["generate", "--model", "\udcff", "--prompt", "x"], "--model is not valid UTF-8"),
    (GEN + ["--temperature", "-1"], "temperature"),
    (GEN + ["--temperature", "nan"], "temperature"),
    (GEN + ["--temperature", "inf"], "temperature"),
    (GEN + ["--temperature", "warm"], "invalid float value"),
    (GEN + ["--top-p", "0"], "top-p"),
    (GEN + ["--top-p", "1.5"], "top-p"),
    (GEN + ["--top-p", "nan"], "top-p"),
    (GEN + ["--top-k", "-1"], "top-k"),
    (GEN + ["--draft-len", "-1"], "--draft-len must be 'auto' or in 0..64"),
    (GEN + ["--draft-len", "100000"], "--draft-len must be 'auto' or in 0..64"),
    (GEN + ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (GEN + ["--max-new-tokens", "lots"], "invalid int value"),
    (GEN + ["--max-new-tokens", "100000"], "exceeds the context of 'tiny-llama' (4096 tokens)"),
    (GEN + ["--seed", "-1"], "--seed must be in 0..2**63-1"),
    (GEN + ["--seed", str(2**63)], "--seed must be in 0..2**63-1"),
    (GEN + ["--num-samples", "0"], "--num-samples must be >= 1"),
    (GEN + ["--mode", "fast"], "invalid choice: 'fast'"),
    (GEN + ["--dtype", "float16"], "invalid choice: 'float16'"),
    (["generate", "--model", "tiny-llama"], "exactly one of --prompt"),
    (GEN + ["--prompts", "{d}/two.jsonl"], "exactly one of --prompt"),
    (["generate", "--model", "tiny-llama", "--prompt", "caf\udce9"], "--prompt is not valid UTF-8"),
    (["generate", "--model", "tiny-llama", "--draft", "random", "--prompt", "x" * 5000], "exceeds the context"),
    (["generate", "--model", "tiny-llama", "--prompts", "{d}/missing.jsonl"], "not found"),
    (["generate", "--model", "tiny-llama", "--prompts", "{d}/adir"], "is a directory"),
    (["generate", "--model", "tiny-llama", "--prompts", "{d}/badjson.jsonl"], "badjson.jsonl:2"),
    (["generate", "--model", "tiny-llama", "--prompts", "{d}/latin1.jsonl"], "not UTF-8"),
    (["generate", "--model", "tiny-llama", "--prompts", "{d}/empty_prompt.jsonl"], "is empty"),
    (GEN + ["--output", "{d}/adir"], "is a directory"),
    (GEN + ["--output", ""], "is a directory"),
    (GEN + ["--output", "{d}/afile/out.jsonl"], "is a file, not a directory"),
    (GEN + ["--output", "{d}/afile/deeper/out.jsonl"], "is a file, not a directory"),
    (GEN + ["--draft", "{d}/missing"], "no MTP checkpoint there"),
    (GEN + ["--mode", "ar", "--draft", "{d}/missing"], "no MTP checkpoint there"),
    (GEN + ["--draft", "{d}/qwen-mtp"], "does not fit"),
    (GEN + ["--draft", "{d}/torn"], "come from different saves"),
    (GEN + ["--draft", "{d}/afile"], "no MTP checkpoint there"),
    (BENCH + ["--batch-sizes", "0"], "values >= 1"),
    (BENCH + ["--batch-sizes", "a,b"], "comma-separated int"),
    (BENCH + ["--batch-sizes", ","], "values >= 1"),
    (BENCH + ["--modes", "ar,fast"], "unknown mode"),
    (BENCH + ["--modes", ","], "unknown mode"),
    (BENCH + ["--repeats", "0"], "--repeats must be >= 1"),
    (BENCH + ["--output", "{d}/adir"], "is a directory"),
    (BENCH + ["--output", ""], "is a directory"),
    (BENCH + ["--output", "{d}/afile/bench.json"], "is a file, not a directory"),
    (BENCH + ["--seed", str(2**64)], "--seed"),
    (BENCH + ["--prompts", "{d}/missing.jsonl"], "not found"),
    (BENCH + ["--mode", "ar"], "unrecognized arguments: --mode"),  # no abbreviations: bench takes --modes
    (BENCH + ["--modes", "ar", "--draft", "{d}/missing"], "no MTP checkpoint there"),
    (DATA + ["--num-samples", "0"], "--num-samples must be >= 1"),
    (DATA + ["--heldout-samples", "0"], "--heldout-samples must be >= 1"),
    (DATA + ["--batch-size", "0"], "--batch-size must be >= 1"),
    (DATA + ["--temperature", "-0.5"], "temperature"),
    (DATA + ["--out", "{d}/afile"], "exists and is not a directory"),
    (DATA + ["--out", "{d}/afile/sub"], "is a file, not a directory"),
    (DATA + ["--prompts", "{d}/missing.jsonl"], "neither"),
    (DATA + ["--prompts", "{d}/one.jsonl"], "at least 2 prompts"),
    (DATA[:-2], "required: --out"),
    (DATA[:-4] + ["--num-samples", "2", "--heldout-samples", "1", "--dtype", "float32", "--out", "{d}/data"],
     "already holds 3 train"),
    (DATA[:-4] + ["--num-samples", "5", "--heldout-samples", "1", "--dtype", "float32", "--mix", "math=1",
                  "--out", "{d}/data"], "other settings (mix"),
    (DATA + ["--mix", "math=0.5,poetry=0.5"], "unknown task kind 'poetry'"),
    (DATA + ["--mix", "math=-1"], "not KIND=WEIGHT"),
    (DATA + ["--mix", "math"], "not KIND=WEIGHT"),
    (DATA + ["--mix", "math=1,math=2"], "given twice"),
    (TRAIN + ["--feature-layers", "0,x"], "not a layer index"),
    (TRAIN + ["--feature-layers", "0,99"], "has layers 0.."),
    (TRAIN + ["--feature-layers", "1,-1"], "given twice"),
    (TRAIN + ["--mtp-layers", "0"], "--mtp-layers"),
    (TRAIN + ["--mtp-layers", "99"], "only"),
    (DATA[:-4] + ["--temperature", "0.5", "--out", "{d}/data"], "other settings"),
    (TRAIN + ["--eval-every", "0"], "--eval-every must be >= 1"),
    (TRAIN + ["--save-every", "0"], "--save-every must be >= 1"),
    (TRAIN + ["--max-seq-len", "0"], "--max-seq-len must be >= 1"),
    (TRAIN + ["--batch-size", "0"], "--batch-size must be >= 1"),
    (TRAIN + ["--steps", "0"], "--steps must be >= 1"),
    (TRAIN + ["--draft-len", "0"], "--draft-len must be >= 1"),
    (TRAIN + ["--draft-len", "65"], "--draft-len must be in 1..64"),
    (TRAIN + ["--draft-vocab", "-5"], "--draft-vocab must be >= 0"),
    (TRAIN + ["--eval-prompts", "-1"], "--eval-prompts must be >= 0"),
    (TRAIN + ["--learning-rate", "0"], "--learning-rate must be"),
    (TRAIN + ["--learning-rate", "nan"], "--learning-rate must be"),
    (TRAIN + ["--learning-rate", "inf"], "--learning-rate must be"),
    (TRAIN + ["--seed", "-3"], "--seed"),
    (TRAIN + ["--loss", "mse"], "unknown loss 'mse'"),
    (TRAIN + ["--data", "{d}/adir"], "no meta.json"),
    (TRAIN + ["--data", "{d}/data_badmeta"], "cannot read meta.json"),
    (TRAIN + ["--data", "{d}/data_badrow"], "train.jsonl:1: not a make-data record"),
    (TRAIN + ["--data", "{d}/data_empty"], "train.jsonl: empty"),
    (TRAIN + ["--data", "{d}/data_strings"], "train.jsonl:1: not a make-data record"),
    (TRAIN + ["--data", "{d}/data_beyond_vocab"], "token ids beyond the vocabulary"),
    (TRAIN + ["--init", "{d}/missing"], "--init"),
    (TRAIN + ["--draft", "{d}/missing"], "unrecognized arguments: --draft"),  # train-draft trains a draft; it reads none
    (TRAIN + ["--out", "{d}/adir"], "is a directory; --out is a path prefix"),
    (TRAIN + ["--out", "{d}/afile/m"], "is a file, not a directory"),
    (TRAIN + ["--resume"], "nothing to resume"),
    (TRAIN + ["--out", "{d}/started"], "already holds a training run"),
    (TRAIN + ["--max-seq-len", "5000"], "exceeds the context"),
    (["train-draft", "--model", "tiny-llama", "--out", "{d}/m"], "required: --data"),
    (CMP + ["--losses", "ce,foo"], "unknown loss(es) ['foo']"),
    (CMP + ["--losses", ","], "unknown loss(es)"),
    (CMP + ["--final-eval-prompts", "0"], "--final-eval-prompts must be >= 1"),
    (CMP + ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (CMP + ["--temperatures", "0.5,x"], "comma-separated float"),
    (CMP + ["--temperatures", "-1"], "values >= 0"),
    (CMP + ["--temperatures", "nan"], "finite"),
    (CMP + ["--out", "{d}/afile"], "exists and is not a directory"),
    (CMP + ["--save-every", "0"], "--save-every must be >= 1"),
    (ENT + ["--num-prompts", "0"], "--num-prompts must be >= 1"),
    (ENT + ["--draft-len", "0"], "--draft-len must be >= 1"),
    (ENT + ["--bootstrap", "0"], "--bootstrap must be >= 1"),
    (ENT + ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (ENT + ["--temperatures", ""], "values >= 0"),
    (ENT + ["--seed", str(2**70)], "--seed"),
    (ENT + ["--policy", "{d}/missing"], "unknown model"),
    (ENT + ["--policy", "{d}/broken_config"], "config.json is unreadable"),
    (ENT + ["--out", "{d}/afile"], "exists and is not a directory"),
    (ENT + ["--draft", "{d}/missing"], "no MTP checkpoint there"),
    (ENT + ["--prompts", "{d}/badjson.jsonl"], "badjson.jsonl:2"),
    (ENT + ["--max-new-tokens", "5000"], "exceeds the context"),
    (TRAIN + ["--kind", "eagle3", "--mtp-layers", "2"], "--mtp-layers must be 1"),
    (TRAIN + ["--kind", "eagle3", "--feature-layers", "0,1"], "reads 3 target layers"),
    (TRAIN + ["--kind", "medusa"], "invalid choice"),
    (["export", "--model", "tiny-llama", "--out", "{d}/e"], "no EAGLE-3 draft ships"),
    (["export", "--model", "tiny-llama", "--draft", "random", "--out", "{d}/e"], "DeepSeek-layout MTP"),
    (["export", "--model", "tiny-llama", "--draft", "{d}/missing", "--out", "{d}/e"], "no MTP checkpoint there"),
    (["export", "--model", "tiny-llama", "--draft", "{d}/adir", "--out", "{d}/e"], "not an EAGLE-3 directory"),
    (["export", "--model", "tiny-llama", "--draft", "random-eagle3", "--out", "{d}/afile"], "exists and is not a dir"),
    (["export", "--model", "tiny-llama", "--draft", "random-eagle3", "--format", "gguf", "--out", "{d}/e"],
     "invalid choice"),
    (["check-exactness", "--model", "tiny-llama", "--mode", "ar"], "--mode must be spec or spec-greedy"),
    (["check-exactness", "--model", "tiny-llama", "--draft-len", "auto"], "invalid int value: 'auto'"),
    (["check-exactness", "--model", "tiny-llama", "--num-samples", "10"], "--num-samples must be >= 100"),
    (["check-exactness", "--model", "tiny-llama", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["check-exactness", "--model", "tiny-llama", "--draft", "{d}/missing"], "no MTP checkpoint there"),
]


@pytest.mark.parametrize("argv,says", SWEEP, ids=[" ".join(a)[:60] for a, _ in SWEEP])
def test_bad_input_sweep(bad, capsys, argv, says):
    err = run_error(capsys, [a.replace("{d}", str(bad)) for a in argv])
    assert says in err, err
    assert not (bad / "newdata").exists() and not (bad / "m.ckpt").exists()  # refused before any work


def test_sweep_is_large():
    assert len(SWEEP) >= 60 and len({a[0] if a else "" for a, _ in SWEEP}) >= 6


@pytest.fixture(scope="module")
def short_context_model(tmp_path_factory, load_models):
    """tiny-llama saved as a local model directory whose config gives it a 256-token context."""
    hf, _, tok = load_models("tiny-llama")
    d = tmp_path_factory.mktemp("ctx256")
    hf.config.max_position_embeddings, old = 256, hf.config.max_position_embeddings
    try:
        hf.save_pretrained(d)
    finally:
        hf.config.max_position_embeddings = old
    tok.save_pretrained(d)
    return d


def test_long_prompt_near_the_models_context(short_context_model, tmp_path, capsys):
    from bebop.models.registry import chat_ids

    model, tok = load_model(str(short_context_model), dtype="float32")
    assert model.max_len == 256  # the context comes from the model's config
    overhead = len(chat_ids(tok, ""))
    K, new = 2, 12
    text = "a" * (256 - overhead - new - (K + 2))  # today's engine reserves K + 2 cache slots past the request
    out = tmp_path / "out.jsonl"
    main(["generate", "--model", str(short_context_model), "--prompt", text, "--max-new-tokens", str(new),
          "--temperature", "0", "--mode", "spec", "--draft", "random", "--draft-len", str(K), "--output", str(out)])
    row = json.loads(out.read_text())
    assert len(row["tokens"]) == new and row["stop_reason"] == "length"
    capsys.readouterr()
    err = run_error(capsys, ["generate", "--model", str(short_context_model), "--draft", "random", "--prompt", text + "a" * (K + 3),
                             "--max-new-tokens", str(new)])
    assert f"prompt of {256 - new + 1} tokens + --max-new-tokens {new} exceeds the context" in err


def test_generate_streams_rows_as_they_finish(tmp_path, capsys, monkeypatch):
    """Each row is written when it finishes; an interruption keeps the rows already done."""
    from bebop.cli import generate as generate_command

    real, seen = generate_command.generate, []

    def interrupted_after_first_row(*args, on_finish, **kw):
        def first_then_stop(i, r):
            on_finish(i, r)
            seen.append(i)
            raise KeyboardInterrupt

        return real(*args, on_finish=first_then_stop, **kw)

    monkeypatch.setattr(generate_command, "generate", interrupted_after_first_row)
    out = tmp_path / "sub" / "out.jsonl"  # a missing parent directory is made
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--num-samples", "3", "--max-new-tokens", "4",
              "--mode", "ar", "--output", str(out)])
    assert exc.value.code == 130
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == seen and len(rows) == 1 and len(rows[0]["tokens"]) >= 1


def test_broken_pipe_exits_quietly(capsys, monkeypatch):
    """`bebop generate ... | head -1`: the reader leaves early; no traceback, no error line. (In-process: a
    pipe whose reading end is closed, as head leaves it; Python ignores SIGPIPE, so the write raises.)"""
    import os
    import sys

    read, write = os.pipe()
    os.close(read)
    stdout = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--max-new-tokens", "3", "--mode", "ar"])
    assert exc.value.code == 141
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error" not in err, err
    stdout.close()  # its descriptor now points at /dev/null: closing it cannot fail


def test_a_full_disk_while_saving_weights_is_one_line(tmp_path, capsys, monkeypatch):
    """safetensors raises its own SafetensorError (not an OSError) when the disk fills while it writes."""
    from safetensors import SafetensorError

    from bebop.cli import generate as generate_command

    def full(args):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(generate_command, "cmd_generate", full)
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "tiny-llama", "--prompt", "hi", "--max-new-tokens", "3"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == ["bebop: error: Error while serializing: I/O error: No space left on device "
                                        "(os error 28)"]


def test_bench_vllm_modes_refuse_what_vllm_cannot_run_before_starting_it(capsys, monkeypatch):
    """One line before any engine starts: a model that lives only in memory, a DeepSeek-layout draft for
    vllm-spec, no vLLM installed."""
    from bebop.backends.vllm import engine as vllm

    monkeypatch.setattr(vllm.VllmEngine, "__init__", lambda *a, **k: pytest.fail("no engine may start"))
    monkeypatch.setattr(vllm, "installed", lambda: True)
    bench = ["bench", "--model", "tiny-llama", "--batch-sizes", "1", "--repeats", "1", "--max-new-tokens", "2"]
    assert "vllm-spec needs an EAGLE-3 draft" in run_error(capsys, [*bench, "--modes", "vllm-spec", "--draft", "random"])
    assert "exists only in memory" in run_error(capsys, [*bench, "--modes", "ar,vllm-spec", "--draft", "random-eagle3"])
    monkeypatch.setattr(vllm, "installed", lambda: False)
    assert "pip install 'bebop-rl[vllm]'" in run_error(capsys, [*bench, "--modes", "vllm"])


def test_compile_and_device_flags_reach_the_model_loader(tmp_path, capsys, monkeypatch):
    import bebop.cli.loading as loading

    seen, real = [], loading.load_model

    def spy(name, dtype="float32", compile=None, device="auto"):
        seen.append((compile, device))
        return real(name, dtype=dtype, compile="0", device=device)  # (eager here: compiling takes minutes)

    monkeypatch.setattr(loading, "load_model", spy)
    base = ["generate", "--model", "tiny-llama", "--prompt", "hi", "--max-new-tokens", "2", "--mode", "ar"]
    monkeypatch.delenv("BEBOP_COMPILE", raising=False)
    main([*base, "--compile", "1", "--device", "cpu"])
    main(base)
    bench = ["bench", "--model", "tiny-llama", "--batch-sizes", "1", "--repeats", "1", "--max-new-tokens", "2",
             "--modes", "ar"]
    main(bench)  # a bench repays a compile: compiled where the probe times it faster
    monkeypatch.setenv("BEBOP_COMPILE", "0")
    main(bench)  # the environment over a command's default
    main([*bench, "--compile", "1"])  # the flag over both
    assert seen == [("1", "cpu"), ("0", "auto"), ("auto", "auto"), ("0", "auto"), ("1", "auto")]
    import bebop.cli.rl as rl  # rl loads its policy itself: its rollouts take --compile too
    from bebop.errors import BebopError

    def stop(name, dtype="float32", compile=None, device="auto"):
        seen.append((compile, device))
        raise BebopError("stop here")

    monkeypatch.setattr(rl, "load_model", stop)
    capsys.readouterr()
    for flags, want in (([], "0"), (["--compile", "auto"], "auto")):
        assert "stop here" in run_error(capsys, ["rl", "--model", "tiny-llama", "--steps", "1", "--out",
                                                 str(tmp_path / "rl"), *flags])
        assert seen[-1] == (want, "auto")
    capsys.readouterr()
    assert "--compile" in run_error(capsys, [*base, "--compile", "yes"])
