"""bebop.models.compiled: the compiled decode and verify forward computes what the eager one computes, on the
tiny models in fp32 and, with the kernels this CPU runs (vLLM's paged attention and fast linears where they
load), in bf16 on a model with a head size those kernels support. Rows sit at different cache lengths, the
batch sizes cover 1 and more (torch compiles them apart) and the forwards one and several new tokens.
Issue 23's wrong result (smollm2-135m compiled whole, L1 ~1.96 from eager at 16 rows over paged attention,
the layers' caches views of one base) did not show in these configurations even with such caches put back:
test_models.py's test_kv_cache_layers_share_no_storage is what guards that cause. The engine on the compiled
step: tests/test_engine.py."""

import copy
import itertools

import pytest
import torch

from bebop.models import compiled, cpu
from bebop.models.kernels import PAGED, paged_runs
from bebop.models.tuning import linear_kinds


def distributions(model, batch=3, steps=(1, 3, 1), seed=0, compiled_first=False, lengths=(5, 9, 7)):
    """The next-token distributions [rows, T, V] of each decode/verify forward after a ragged prefill (rows of
    `lengths` prompt tokens, cycled; a prompt above DECODE_MAX_T tokens is prefilled eagerly), eager and
    compiled, on two copies of one cache state."""
    g = torch.Generator().manual_seed(seed)
    V = model.cfg.vocab_size
    prompt_len = [lengths[r % len(lengths)] for r in range(batch)]
    prompt = torch.randint(0, V, (batch, max(prompt_len)), generator=g)
    out = {}
    for flag in ((True, False) if compiled_first else (False, True)):
        model.compiled = False
        cache = model.new_cache(batch, 40)
        model(prompt, cache)  # eager prefill
        cache.lengths[:] = torch.tensor(prompt_len)
        model.compiled = flag
        g_steps = torch.Generator().manual_seed(seed + 1)
        probs = []
        for T in steps:
            tokens = torch.randint(0, V, (batch, T), generator=g_steps)
            probs.append(model.logits(model(tokens, cache)).softmax(-1))
            cache.lengths += T
        out[flag] = probs
    model.compiled = False
    return out[False], out[True]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("batch", [1, 3])
def test_compiled_forward_equals_eager_fp32(name, batch, request):
    model = copy.deepcopy(request.getfixturevalue(name.replace("-", "_"))[0])
    eager, comp = distributions(model, batch=batch)
    for e, c in zip(eager, comp):
        assert (e - c).abs().sum(-1).max() < 1e-4


def test_compiled_forward_with_this_cpus_bf16_kernels_is_as_close_to_fp32_as_eager(vllm_model_dir):
    """bf16 with the attention and linear kernels the probe could choose here: the compiled step's distance
    from the fp32 distributions is of the size of eager bf16's (rounding), not the L1 of a wrong step."""
    from bebop.models.registry import load_model

    ref, _ = load_model(vllm_model_dir, dtype="float32")
    ref_dists, _ = distributions(ref, batch=16)
    bf16 = copy.deepcopy(ref).to(torch.bfloat16)
    cpu_dev = torch.device("cpu")
    attentions = [("sdpa", "sdpa")] + [(PAGED, PAGED)] * paged_runs(torch.bfloat16, cpu_dev, bf16.cfg.head_dim)
    for attention in attentions:
        for kind in linear_kinds(torch.bfloat16, cpu_dev):
            bf16.attention, bf16.linear = attention, kind
            eager, comp = distributions(bf16, batch=16)
            for r, e, c in zip(ref_dists, eager, comp):
                err_eager, err_comp = (e - r).abs().sum(-1).max(), (c - r).abs().sum(-1).max()
                assert err_comp < 2 * err_eager + 0.02, (attention, kind, float(err_comp), float(err_eager))


def test_compiled_forward_with_vllms_fp32_kernels_equals_eager(vllm_model_dir):
    """fp32 over vLLM's paged attention and oneDNN matmul (what the probe may choose on an AVX2-only CPU, where
    vLLM's AVX2 build loads): the compiled step computes the eager one's distributions, to float rounding, and
    reads the matmul's copies of weights changed in place."""
    from bebop.models.registry import load_model

    model, _ = load_model(vllm_model_dir, dtype="float32")
    cpu_dev = torch.device("cpu")
    if not (paged_runs(torch.float32, cpu_dev, model.cfg.head_dim) and "onednn" in linear_kinds(torch.float32, cpu_dev)):
        pytest.skip(f"vLLM's fp32 kernels are not loaded on this CPU ({cpu.describe()})")
    model.attention, model.linear = (PAGED, PAGED), "onednn"
    for changed in (False, True):  # then compiled first, its 5-token prefill too: eager would rebuild the copies
        eager, comp = distributions(model, batch=16, compiled_first=changed, lengths=(5,) if changed else (5, 9, 7))
        for e, c in zip(eager, comp):
            assert (e - c).abs().sum(-1).max() < 1e-4
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1.5)  # stale copies would sit far from eager


def test_compiled_forward_equals_eager_on_smollm2_paged(smollm2):
    """The default model in bf16 over vLLM's paged attention and fast linears, 16 rows: where issue 23's
    wrong result showed in a standalone script."""
    model = copy.deepcopy(smollm2[0]).to(torch.bfloat16)
    if not paged_runs(torch.bfloat16, torch.device("cpu"), model.cfg.head_dim):
        pytest.skip(f"vLLM's CPU attention does not run on this CPU ({cpu.describe()})")
    model.attention = (PAGED, PAGED)
    fast = [k for k in linear_kinds(torch.bfloat16, torch.device("cpu")) if k in ("amx", "onednn")]
    model.linear = ",".join(f"{k}:{n}" for k, n in zip(fast, (1, 4))) + f",{fast[0]}" if len(fast) > 1 else \
        (fast or ["plain"])[0]  # as the probe picked on this Xeon: amx:1,onednn:4,amx
    eager, comp = distributions(model, batch=16, steps=(1,))
    assert (eager[0] - comp[0]).abs().sum(-1).max() < 0.1  # bf16 rounding: 0.03


def test_compiled_step_reads_weights_changed_in_place(vllm_model_dir):
    """An optimiser step or a weight sync changes weights in place between generations: the compiled step,
    which reads the fast kernels' copies of the weights, uses the new weights (the copies are rebuilt)."""
    from bebop.models.registry import load_model

    model, _ = load_model(vllm_model_dir, dtype="bfloat16")
    fast = [k for k in linear_kinds(torch.bfloat16, torch.device("cpu")) if k in ("amx", "onednn")]
    if not fast:
        pytest.skip(f"no linear kernel here keeps a copy the compiled step reads ({cpu.describe()})")
    model.linear = fast[0]
    before, _ = distributions(model, batch=1)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    # compiled first, prefill included (5 tokens): an eager forward would rebuild the copies first
    eager, comp = distributions(model, batch=1, compiled_first=True)
    assert (eager[0] - before[0]).abs().sum(-1).max() > 1e-2  # the change shows
    for e, c in zip(eager, comp):
        assert (e - c).abs().sum(-1).max() < 0.05  # bf16 rounding; stale weights would sit as far as `before`


def test_bebop_compile_decides_what_a_loaded_model_runs(monkeypatch, tiny_llama):
    from bebop.errors import BebopError
    from bebop.models.registry import compile_mode, load_model

    for value, want in (("0", False), ("1", True), ("auto", False)):  # auto: as the probe found (none for tiny)
        monkeypatch.setenv("BEBOP_COMPILE", value)
        assert load_model("tiny-llama", dtype="auto")[0].compiled is want
        assert compiled.wanted(compile_mode(None), True) is (value != "0")
        assert load_model("tiny-llama", dtype="auto", compile="0")[0].compiled is False  # the argument wins
    monkeypatch.delenv("BEBOP_COMPILE")
    assert compile_mode(None) == "0"  # eager unless asked
    assert load_model("tiny-llama", compile="1", dtype="float32")[0].compiled is True
    monkeypatch.setenv("BEBOP_COMPILE", "yes")
    with pytest.raises(BebopError, match="BEBOP_COMPILE"):
        compile_mode(None)
    with pytest.raises(BebopError, match="compile must be"):
        load_model("tiny-llama", compile="yes", dtype="float32")


def test_the_probe_keeps_the_compiled_step_only_where_it_is_faster(monkeypatch, tiny_llama, tmp_path):
    """Compile mode "auto": the probe times compiled against eager (an injected timer here) and keeps it where
    it is 5% faster; the answer is cached with the rest of the probe's."""
    from bebop.models import tuning

    for factor, want in ((0.8, True), (0.97, False), (1.2, False)):
        def timer(m, batch, new_tokens):
            return 0.01 * (factor if m.compiled else 1.0)

        got = tuning.choose(tiny_llama[0], f"model-{factor}", tmp_path, timer, compile_mode="auto")
        assert got["compiled"] is want and len(got["compiled_ms"]["eager"]) == len(tuning.SHAPES)
        assert tuning.read_cache(tmp_path)[tuning.cache_key(f"model-{factor}", torch.device("cpu"))] == got
    assert tiny_llama[0].compiled is False  # the probe times a copy


@pytest.mark.parametrize("mode", ["ar", "spec", "spec-auto"])
def test_a_generation_after_the_warm_up_compiles_nothing(tiny_qwen3, mode, tmp_path, monkeypatch):
    """compiled.warm_up covers every graph a generation meets: a compile inside one would land in its timed or
    latency-bound part (one did, before duck sizing was turned off: the warm-up's sizes equal by chance became
    one symbol, and every real generation recompiled on that guard; with auto K, the tokens of a step that
    drafts fewer than the most are a view with the row stride of the longest, and recompiled on it)."""
    from torch._dynamo.utils import counters

    from bebop.engine import generation as engine
    from bebop.drafts.eagle3 import new_eagle3
    from bebop.engine.generation import generate

    model = copy.deepcopy(tiny_qwen3[0])
    model.compiled = True
    draft = new_eagle3(model, 0)  # its verify forwards capture target layers: graphs of their own
    prompts = [list(range(3, 14)), list(range(20, 33)), list(range(40, 50))]  # > 8 tokens: prefilled eagerly
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))  # (auto K's cost probe)
    compiled.warm_up(model, len(prompts), 4, draft.feature_layers if mode != "ar" else ())
    graphs = counters["stats"]["unique_graphs"]
    K = "auto" if mode == "spec-auto" else 3
    if K == "auto":  # every K from 0 to 3 in turn
        monkeypatch.setattr(engine, "choose_draft_len", lambda *a, **k: next(ks))
        ks = itertools.cycle(range(4))
    for n in (12, 30):  # two cache lengths
        generate(model, prompts, n, mode=mode.removesuffix("-auto"), draft=draft, draft_len=K, max_draft_len=3,
                 seed=n, eos_ids=[], max_batch=len(prompts))
    assert counters["stats"]["unique_graphs"] == graphs


def test_a_shape_class_compiles_in_one_pass(vllm_model_dir):
    """dynamo traces each graph once: a float it traced as a symbol (a norm's eps, which vLLM's rms_norm takes)
    made it restart after a whole inductor compile, doubling every compile (bebop.models.compiled.compiled)."""
    from torch._dynamo.utils import compilation_time_metrics

    from bebop.models.registry import load_model

    model, _ = load_model(vllm_model_dir, dtype="auto")
    model = copy.deepcopy(model)
    model.compiled = True
    compilation_time_metrics.clear()
    cache = model.new_cache(2, 40)
    cache.lengths[:] = 3
    with torch.inference_mode():
        model(torch.zeros(2, 1, dtype=torch.long), cache)
    attempts = [k for k in compilation_time_metrics if k.startswith("compile_attempt_")]
    assert attempts == ["compile_attempt_0"], attempts


def test_the_stack_compiles_whole_when_it_captures_layers(monkeypatch):
    """An EAGLE-3 draft's verify forward captures target layers. Compiled with dynamic shapes, indices above 1
    (0 and 1 are specialised) were symbols that `i in capture` matched to none, and the stack fell back, without
    a word, to a graph per layer, slower than eager. Now it compiles whole (or raises: fullgraph) and captures
    what eager captures."""
    from bebop.models import registry

    monkeypatch.setitem(registry.TINY["tiny-llama"], "num_hidden_layers", 4)
    model, _ = registry.load_model("tiny-llama", dtype="float32")
    capture = (2, -1, 3)  # any order, as a draft's config may list them
    out = {}
    for flag in (False, True):
        model.compiled = False
        cache = model.new_cache(2, 40)
        model(torch.arange(3, 15).view(2, 6), cache)  # eager prefill
        cache.lengths[:] = 6
        model.compiled = flag
        with torch.inference_mode():
            out[flag] = model(torch.tensor([[7, 8], [9, 10]]), cache, capture)
    model.compiled = False
    (hidden, features), (hidden_c, features_c) = out[False], out[True]
    assert features.shape == (2, 2, 3 * model.cfg.dim)
    assert torch.allclose(hidden, hidden_c, atol=1e-5) and torch.allclose(features, features_c, atol=1e-5)


def test_a_capturing_forward_on_smollm2_runs_compiled(smollm2):
    """An EAGLE-3 draft's verify forward on the default model over vLLM's kernels (bf16; rms_norm reads each
    layer's output): concatenated inside the graph, the captured outputs made inductor hand a buffer on while
    the next norm still read it, and the generated code failed on the freed name (every spec-compiled shape
    of smollm2-135m; not on the tiny models). The graph now returns them and the caller concatenates."""
    model = copy.deepcopy(smollm2[0]).to(torch.bfloat16)
    if not paged_runs(torch.bfloat16, torch.device("cpu"), model.cfg.head_dim):
        pytest.skip(f"vLLM's CPU attention does not run on this CPU ({cpu.describe()})")
    model.attention = (PAGED, PAGED)
    model.linear = "onednn" if "onednn" in linear_kinds(torch.bfloat16, torch.device("cpu")) else "plain"
    capture = (1, 14, 26)  # the shipped draft's
    tokens = smollm2[1]("Once upon a time there was a little robot who", return_tensors="pt")["input_ids"]
    out = {}
    for flag in (False, True):
        model.compiled = False
        cache = model.new_cache(1, 64)
        with torch.inference_mode():
            model(tokens[:, :-2], cache)  # eager prefill
            cache.lengths[:] = tokens.shape[1] - 2
            model.compiled = flag
            out[flag] = model(tokens[:, -2:], cache, capture)
    model.compiled = False
    (hidden, features), (hidden_c, features_c) = out[False], out[True]
    assert features.shape == features_c.shape == (1, 2, 3 * model.cfg.dim)
    for e, c in ((hidden, hidden_c), (features, features_c)):
        assert ((e - c).float().norm() / e.float().norm()) < 0.05  # bf16 rounding: ~0.01


def test_over_a_paged_cache_one_graph_serves_one_row_and_one_token_too(vllm_model_dir):
    """With a paged cache, sizes of 1 are traced as any other size: one graph for every batch size and number of
    new tokens within one linear kind (one kind here, so one graph). Specialised, one row and one new token each
    had graphs of their own; rope's roll and the attention's [B, H, T, D] output guarded on T = 1 even so."""
    from torch._dynamo.utils import counters

    from bebop.models.registry import load_model

    model = copy.deepcopy(load_model(vllm_model_dir, dtype="float32")[0]).to(torch.bfloat16)
    if not paged_runs(torch.bfloat16, torch.device("cpu"), model.cfg.head_dim):
        pytest.skip(f"vLLM's CPU attention does not run on this CPU ({cpu.describe()})")
    model.attention, model.linear = (PAGED, PAGED), "plain"
    torch._dynamo.reset()  # (earlier tests may have compiled this model's graph) and so what bebop has seen
    compiled._seen.clear()
    graphs = counters["stats"]["unique_graphs"]
    for B, T in ((3, 2), (1, 1), (3, 1), (1, 3), (5, 4)):
        eager, comp = distributions(model, batch=B, steps=(T,))
        assert (eager[0] - comp[0]).abs().sum(-1).max() < 0.05  # bf16 rounding
    assert counters["stats"]["unique_graphs"] - graphs == 1
