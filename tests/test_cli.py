"""The command line end to end on tiny models, and its bad-input contract: one line, exit status 2."""

import json

import pytest

from bebop.cli import main
from bebop.models.registry import load_model
from bebop.mtp import new_mtp


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
    main(["generate", "--model", "tiny-llama", "--prompts", str(prompts), "--num-samples", "2", "--max-new-tokens",
          "5", "--temperature", "0.8", "--mode", "spec", "--draft-len", "2", "--seed", "3", "--output", str(out)])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["prompt_index"] for x in lines] == [0, 0, 1, 1]
    assert all(1 <= len(x["tokens"]) <= 5 and isinstance(x["text"], str) for x in lines)
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["mode"] == "spec" and stats["drafted"] > 0


def test_generate_auto_draft_len_through_a_small_batch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))  # the probed cost table goes here
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n{"prompt": "2+2?"}\n')
    out = tmp_path / "out.jsonl"
    main(["generate", "--model", "tiny-llama", "--prompts", str(prompts), "--num-samples", "3", "--max-new-tokens",
          "8", "--mode", "spec", "--max-batch", "2", "--max-draft-len", "2", "--output", str(out)])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["prompt_index"] for x in lines] == [0, 0, 0, 1, 1, 1]  # request order, though rows finish in any
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["tokens"] == sum(len(x["tokens"]) for x in lines)
    assert stats["steps"] == 0 or 0 < stats["mean_draft_len"] <= 2
    assert (tmp_path / "draft-costs-v2.json").exists()


def test_bench_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(["bench", "--model", "tiny-qwen3", "--batch-sizes", "1,2", "--modes", "ar,spec,spec-greedy,hf",
          "--draft-len", "2", "--max-new-tokens", "6", "--repeats", "1", "--dtype", "bfloat16", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["model"] == "tiny-qwen3" and report["dtype"] == "bfloat16"
    rows = report["results"]
    assert {(r["mode"], r["batch_size"]) for r in rows} == {(m, b) for m in ("ar", "spec", "spec-greedy", "hf")
                                                           for b in (1, 2)}
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["temperature"] == 1.0
        if r["mode"].startswith("spec"):
            assert 0 <= r["acceptance_rate"] <= 1 and len(r["per_position_acceptance"]) == 2
            assert 1 <= r["mean_acceptance_length"] <= 3 and r["mean_entropy"] > 0
    assert "tok/s" in capsys.readouterr().out


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    base = ["generate", "--model", "tiny-llama", "--prompt", "hi", "--max-new-tokens", "2"]
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
    other, _ = load_model("tiny-qwen3")
    new_mtp(other).save(tmp_path / "qwen-mtp")
    assert "does not fit" in run_error(capsys, base + ["--mtp", str(tmp_path / "qwen-mtp")])
    assert "values >= 1" in run_error(capsys, ["bench", "--model", "tiny-llama", "--batch-sizes", "0"])
    assert "unknown mode" in run_error(capsys, ["bench", "--model", "tiny-llama", "--modes", "ar,fast"])
    assert "no meta.json" in run_error(capsys, ["train-mtp", "--model", "tiny-llama", "--data", str(tmp_path),
                                                  "--out", str(tmp_path / "m")])
    assert "unknown loss" in run_error(capsys, ["train-mtp", "--model", "tiny-llama", "--data", str(tmp_path),
                                                "--loss", "mse", "--out", str(tmp_path / "m")])
