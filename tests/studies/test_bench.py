"""bench's token accounting: requests stop at EOS by default and only the tokens produced count (ours and
transformers' alike); --ignore-eos generates exactly max_new_tokens per request."""

import pytest

from bebop.studies.bench import environment, run_bench
from bebop.models import cpu
from bebop.drafts.mtp import new_mtp
from bebop.sampling import SamplingParams


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_tokens_counted_up_to_eos(load_models, monkeypatch, ignore_eos):
    hf, model, tok = load_models("tiny-qwen3")
    # every token ends a request: with EOS stops each request produces exactly one token, in every mode
    monkeypatch.setattr(model, "eos_ids", list(range(model.cfg.vocab_size)))
    prompts = [[1, 5, 9, 4], [1, 7]]
    results = run_bench(model, prompts, [2, 3], ["ar", "spec", "hf"], 2, SamplingParams(1.0), max_new_tokens=5,
                        repeats=2, mtp=new_mtp(model), hf_model=hf, tokenizer=tok, ignore_eos=ignore_eos)
    for r in results:
        per_request = 5 if ignore_eos else 1
        assert r["tokens"] == r["batch_size"] * 2 * per_request, r
        assert r["mean_tokens_per_request"] == per_request and r["ignore_eos"] == ignore_eos


def test_environment_names_dtype_and_cpu(tiny_llama):
    model, _ = tiny_llama
    env = environment(model)
    assert env["dtype"] == "float32" and env["attention"] == list(model.attention) and env["cpu"] == cpu.cpu_model()
    assert env["cpu_capability"] == cpu.describe() and cpu.capability() in env["cpu_capability"]
    assert env["threads"] >= 1


def test_compiled_modes_run_the_compiled_step_beside_eager_ones(tiny_llama, monkeypatch):
    """`ar-compiled` runs the engine on the compiled step and `ar` eager in the same run, whatever the model was
    loaded with; the model is left as it was. (The compile itself is stubbed: tests/test_compiled.py checks it.)"""
    import bebop.studies.bench as bench
    from bebop.models import compiled

    model, _ = tiny_llama
    seen = []
    monkeypatch.setattr(compiled, "layers", lambda model, fn: (seen.append(True), fn)[1])
    ran = []

    def spy(target, *args, **kw):
        ran.append((kw["mode"], target.compiled))
        return generate(target, *args, **kw)

    generate = bench.generate
    monkeypatch.setattr(bench, "generate", spy)
    monkeypatch.setattr(model, "compiled", True)  # as BEBOP_COMPILE=1 would load it
    results = run_bench(model, [[1, 5, 9, 4], [1, 7]], [2], ["ar", "ar-compiled"], 2, SamplingParams(1.0),
                        max_new_tokens=4, repeats=2)
    assert set(ran) == {("ar", False), ("ar", True)} and seen
    assert [r["mode"] for r in results] == ["ar", "ar-compiled"] and all(r["tokens"] > 0 for r in results)
    assert results[1]["speedup_vs_ar"] is not None and model.compiled is True
