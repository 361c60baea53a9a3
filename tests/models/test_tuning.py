"""`--dtype auto`: the probe's decision rule (with an injected timer, so the outcome is known), its cache and
its key, and one real probe end to end through registry.load_model on a tiny model saved as a local directory."""

import json
import math

import pytest
import torch

from bebop.errors import BebopError
from bebop.models import cpu
from bebop.models import tuning
from bebop.models import registry


@pytest.fixture(autouse=True)
def bf16_native(monkeypatch):
    """The decision rule is tested on both dtypes on every machine: bf16 counts as native here (the probe times
    float32 alone where it is not: `avx2_only` below says so, and its test checks that)."""
    for cached in (cpu.packs_bf16_linears, cpu.vllm_cpu_ops, cpu.vllm_cpu_attention, cpu.amx_bf16_linears,
                   cpu.onednn_linears):
        cached()  # their cached answers are the CPU's own, not this pretence's: later tests run what they say
    monkeypatch.setattr(cpu, "native_bf16", lambda: True)


def fake_timer(costs, calls=None, several=None, linear=None):
    """A timer whose forward costs `costs[(dtype name, attention)]` seconds, times the new tokens; with
    `several`, forwards of more than one new token per row cost `several[(dtype name, attention)]` instead;
    with a linear kind in `linear` ({kind: factor}, or {(dtype name, kind): factor} for one dtype's), times its
    factor."""
    def timer(model, batch, new_tokens):
        if calls is not None:
            calls.append((batch, new_tokens))
        name = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[model.embed.weight.dtype]
        kind = model.attention[new_tokens > 1]
        table = several if several is not None and new_tokens > 1 else costs
        factor = (linear or {}).get((name, model.linear), (linear or {}).get(model.linear, 1.0))
        return table[(name, kind)] * batch * new_tokens * factor
    return timer


def n_configs():
    """(dtype, attention, linear) configs the probe times on this machine: packed weights only where oneDNN
    takes them (fp32 where torch has the op, bf16 where the CPU computes it natively)."""
    cpu = torch.device("cpu")
    return sum(len(tuning.ATTENTION_KINDS) * len(tuning.linear_kinds(d, cpu)) for d in tuning.DTYPES.values())


def table(f32, bf16):
    """{(dtype, kernel): cost} from (sdpa, folded, matmul) costs per dtype."""
    return {**{("float32", a): c for a, c in zip(tuning.ATTENTION_KINDS, f32)},
            **{("bfloat16", a): c for a, c in zip(tuning.ATTENTION_KINDS, bf16)}}


@pytest.mark.parametrize("costs,want", [
    (table((1.0, 1.2, 1.1), (0.6, 0.7, 0.5)), ("bfloat16", ["matmul", "matmul"])),
    (table((1.0, 1.0, 0.8), (0.9, 0.95, 2.0)), ("float32", ["matmul", "matmul"])),
    # bf16 only 3% faster: not worth fp32's precision
    (table((1.0, 1.1, 1.2), (0.97, 0.99, 1.5)), ("float32", ["sdpa", "sdpa"])),
    # another kernel only 2% faster: SDPA stays
    (table((1.0, 0.99, 0.98), (0.5, 0.495, 0.49)), ("bfloat16", ["sdpa", "sdpa"])),
    (table((1.0, 0.8, 1.1), (0.6, 0.5, 0.7)), ("bfloat16", ["folded", "folded"])),
])
def test_probe_picks_the_fastest_config(tiny_llama, costs, want):
    model, _ = tiny_llama
    calls = []
    got = tuning.probe(model, fake_timer(costs, calls), shapes=((1, 1), (4, 2)), repeats=2)
    assert (got["dtype"], got["attention"]) == want
    assert got["attention_for"][want[0]] == want[1]
    assert calls.count((4, 2)) == n_configs() * 3  # configs x (warm-up + repeats) at a shape only this probe times
    # (the fast linear kinds, all as fast as plain here, are timed again per row count, and gain nothing: plain)
    assert got["linear_for"] == {"float32": "plain", "bfloat16": "plain"}
    assert got["ms"]["float32/sdpa/plain"] == pytest.approx([1e3 * b * t for b, t in ((1, 1), (4, 2))])
    assert model.embed.weight.dtype == torch.float32 and model.attention == ("sdpa", "sdpa")  # caller's untouched
    assert model.linear == "plain"


@pytest.mark.parametrize("kind,factor,want", [("packed", 0.8, "packed"), ("packed", 1.1, "plain"),
                                               ("amx", 0.8, "amx"), ("amx", 1.1, "plain")])
def test_probe_picks_a_linear_kind_where_it_is_faster(tiny_llama, kind, factor, want, monkeypatch):
    """Every linear kind computes the same products: the faster wins, with no margin; and a dtype is judged
    with its faster linear kind (bf16 10% slower than fp32 with plain weights, 12% faster with the fast kind).
    The timer is fake, so this CPU is told it packs and has the AMX kernel: the rule is tested on every CPU."""
    monkeypatch.setattr(cpu, "packs_bf16_linears", lambda: True)
    monkeypatch.setattr(cpu, "amx_bf16_linears", lambda: True)
    monkeypatch.setattr(cpu, "onednn_linears", lambda: False)
    model, _ = tiny_llama
    assert tuning.linear_kinds(torch.bfloat16, torch.device("cpu")) == ("plain", "packed", "amx")
    fp32_packs = hasattr(torch.ops.mkldnn, "_reorder_linear_weight")  # oneDNN packs fp32 on any CPU it runs on
    assert tuning.linear_kinds(torch.float32, torch.device("cpu")) == ("plain", "packed")[:1 + fp32_packs]
    costs = table((1.0, 1.2, 1.2), (1.1, 1.3, 1.3))  # (packed fp32 costs what plain does here: plain stays)
    timer = fake_timer(costs, linear={("bfloat16", kind): factor})
    got = tuning.probe(model, timer, shapes=((1, 1), (4, 2)), repeats=1)
    assert got["linear_for"] == {"float32": "plain", "bfloat16": want}
    assert (got["dtype"], got["linear"]) == (("float32", "plain") if want == "plain" else ("bfloat16", want))


def rows_timer(factors, drift=None):
    """A timer for row_choice: a forward costs its rows (batch x new tokens) times factors[kind][ROW_SHAPES
    index] ms; with `drift`, times drift(n) for the n-th call (a shared machine's speed changing)."""
    calls = []

    def timer(model, batch, new_tokens):
        j = tuning.ROW_SHAPES.index((batch, new_tokens))
        calls.append(1)
        return 1e-3 * batch * new_tokens * factors[model.linear][j] * (drift(len(calls)) if drift else 1.0)
    return timer


@pytest.mark.parametrize("default,onednn,want", [
    ("amx", [1.2, 0.8, 1.2, 0.8, 0.8], "amx:1,onednn:4,amx:16,onednn"),  # each count its kernel
    ("onednn", [1.03, 0.8, 1.03, 0.8, 0.8], "onednn"),  # amx 3% faster at 1 and 16 rows: a near tie keeps onednn
    ("amx", [1.05, 1.05, 1.05, 1.05, 0.9], "amx:64,onednn"),
    ("amx", [1.1, 1.1, 1.1, 1.1, 1.1], "amx"),
])
def test_row_choice_gives_a_row_count_another_kind_where_it_is_faster(tiny_llama, default, onednn, want):
    """The kinds compete at every row count of ROW_SHAPES (1, 4, 16, 64, 256 rows); the probe's best single
    kind serves every count where no other kind is 5% faster; the answer is a kind per row count that the
    decoder's linears take, and the model's own kind is restored. The machine's speed swinging by 2x from one
    repetition to the next (kinds timed back to back at a shape, judged by their ratio) changes nothing."""
    from bebop.models.kernels import Linear, linear_rows

    model, _ = tiny_llama
    assert [b * t for b, t in tuning.ROW_SHAPES] == [1, 4, 16, 64, 256]
    factors = {"amx": [1.0] * 5, "onednn": onednn}
    per_rep = 2 * len(tuning.ROW_SHAPES)
    for drift in (None, lambda n: 2.0 ** ((n - 1) // per_rep % 2)):
        got, ms = tuning.row_choice(model, ["amx", "onednn"], default, rows_timer(factors, drift), repeats=3)
        assert got == want and model.linear == "plain"
        assert ms["onednn"] == pytest.approx([r * f for r, f in zip([1, 4, 16, 64, 256], onednn)])
    model.linear = got
    assert all(m.rows == linear_rows(got) for m in model.modules() if isinstance(m, Linear))
    model.linear = "plain"


def test_the_probe_chooses_linears_per_row_count_where_two_fast_kinds_run(tiny_llama, monkeypatch):
    """Where two fast kinds run (vLLM's AMX and oneDNN linears here, pretended on every CPU), the whole-forward
    probe picks the dtype, attention and best single kind, then row_choice splits the rows between the two:
    what the probe stores and the loader applies is a kind per row count."""
    monkeypatch.setattr(cpu, "packs_bf16_linears", lambda: False)
    monkeypatch.setattr(cpu, "amx_bf16_linears", lambda: True)
    monkeypatch.setattr(cpu, "onednn_linears", lambda: True)
    model, _ = tiny_llama
    assert tuning.linear_kinds(torch.bfloat16, torch.device("cpu")) == ("plain", "amx", "onednn")
    costs = fake_timer(table((1.0, 1.2, 1.2), (1.1, 1.3, 1.3)),  # (vLLM's fp32 oneDNN matmul as fast as plain)
                       linear={("bfloat16", "amx"): 0.7, ("bfloat16", "onednn"): 0.75})
    rows = rows_timer({"plain": [2.0] * 5, "amx": [1.0] * 5, "onednn": [1.2, 0.8, 1.2, 0.8, 0.8]})

    def timer(m, batch, new_tokens):  # the whole-forward probe's shapes, then row_choice's (fp32's kinds, as fast
        # as one another there too, at every row count)
        if (batch, new_tokens) not in tuning.ROW_SHAPES:
            return costs(m, batch, new_tokens)
        return rows(m, batch, new_tokens) if m.embed.weight.dtype == torch.bfloat16 else 1e-3 * batch * new_tokens

    got = tuning.probe(model, timer, shapes=((2, 1), (8, 2)), repeats=1)
    assert got["dtype"] == "bfloat16" and got["linear"] == got["linear_for"]["bfloat16"]
    assert got["linear"] == "amx:1,onednn:4,amx:16,onednn" and got["linear_for"]["float32"] == "plain"
    assert set(got["linear_rows_ms"]["bfloat16"]) == {"amx", "onednn"}


def test_plain_the_best_single_kind_still_gives_row_counts_to_a_faster_kind(tiny_llama, avx2_only, monkeypatch):
    """What an emulated AVX2-only CPU measured in fp32: plain F.linear the best single kind over the probe's
    shapes (much the fastest at 1 row), vLLM's oneDNN matmul 7% faster at 16 rows. Plain takes part in the
    per-row-count choice like any kind: the row counts where oneDNN is 5% faster go to it, the others stay
    plain; where oneDNN is 3% faster, a near tie, plain stays everywhere."""
    monkeypatch.setattr(cpu, "onednn_linears", lambda: True)
    monkeypatch.setattr(tuning, "packs_weights", lambda dtype, device: False)
    model, _ = tiny_llama
    assert tuning.linear_kinds(torch.float32, torch.device("cpu")) == ("plain", "onednn")
    costs = fake_timer(table((1.0, 1.2, 1.2), (2.0, 2.0, 2.0)), linear={("float32", "onednn"): 1.05})
    for onednn, want in (([1.2, 0.94, 0.93, 0.94, 0.94], "plain:1,onednn"),
                         ([1.2, 1.0, 0.93, 0.99, 0.99], "plain:4,onednn:16,plain"),
                         ([1.2, 1.0, 0.97, 0.98, 0.99], "plain")):
        rows = rows_timer({"plain": [1.0] * 5, "onednn": onednn})

        def timer(m, batch, new_tokens):
            return (rows if (batch, new_tokens) in tuning.ROW_SHAPES else costs)(m, batch, new_tokens)

        got = tuning.probe(model, timer, shapes=((2, 1), (8, 2)), repeats=1)
        assert got["dtype"] == "float32" and got["linear"] == want
        assert set(got["linear_rows_ms"]["float32"]) == {"plain", "onednn"}


@pytest.mark.parametrize("factor,want", [(0.8, ["paged", "paged"]), (0.97, ["folded", "sdpa"])])
def test_probe_picks_paged_attention_for_every_phase_where_it_is_faster(tiny_llama, factor, want, monkeypatch):
    """Paged attention (vLLM's kernel over its own cache layout) serves both phases at once: it replaces the best
    per-phase pair where it is 5% faster over all shapes, not otherwise; only bf16 is offered it. The timer is
    fake and the kernel pretended, so the rule is tested on every CPU."""
    monkeypatch.setattr(tuning, "paged_runs", lambda dtype, device, head_dim: dtype == torch.bfloat16)
    model, _ = tiny_llama
    assert tuning.attention_kinds(torch.bfloat16, model) == (*tuning.ATTENTION_KINDS, "paged")
    assert tuning.attention_kinds(torch.float32, model) == tuning.ATTENTION_KINDS
    one = table((1.0, 1.2, 1.2), (0.5, 0.4, 0.6))  # one new token: folded fastest in bf16
    several = table((1.0, 1.2, 1.2), (0.5, 0.6, 0.6))  # several: SDPA
    pair = math.exp((math.log(0.4 * 1) + math.log(0.5 * 4 * 2)) / 2)  # the pair's geomean over the two shapes
    scale = factor * pair / math.sqrt(1 * 1 * 4 * 2)  # paged costs scale x (batch x new tokens) on both shapes
    one[("bfloat16", "paged")] = several[("bfloat16", "paged")] = scale
    got = tuning.probe(model, fake_timer(one, several=several), shapes=((1, 1), (4, 2)), repeats=1)
    assert got["attention_for"]["bfloat16"] == want and got["attention_for"]["float32"] == ["sdpa", "sdpa"]
    assert ("bfloat16/paged/plain" in got["ms"]) and not any("float32/paged" in k for k in got["ms"])


def test_probe_picks_a_kernel_per_phase(tiny_llama):
    """What this Intel Xeon measured in bf16 (issue 7): SDPA fastest for one new token per row, the folded
    layout for several; and a dtype is judged with its best kernel in each phase."""
    model, _ = tiny_llama
    one = table((1.0, 1.3, 1.2), (0.8, 1.2, 1.1))
    several = table((1.0, 1.1, 1.2), (1.6, 0.8, 1.0))  # bf16 SDPA alone would lose to fp32 here
    got = tuning.probe(model, fake_timer(one, several=several), shapes=((1, 1), (8, 1), (8, 4)), repeats=1)
    assert got["attention_for"] == {"float32": ["sdpa", "sdpa"], "bfloat16": ["sdpa", "folded"]}
    assert (got["dtype"], got["attention"]) == ("bfloat16", ["sdpa", "folded"])


def test_probe_is_cached_per_model_and_thread_count(tiny_llama, tmp_path, monkeypatch):
    model, _ = tiny_llama
    costs = table((1.0, 1.0, 1.0), (0.5, 0.5, 0.5))
    calls = []
    first = tuning.choose(model, "m1", tmp_path, fake_timer(costs, calls))
    n = len(calls)
    assert n > 0 and first["dtype"] == "bfloat16"
    assert tuning.choose(model, "m1", tmp_path, fake_timer(costs, calls)) == first and len(calls) == n
    tuning.choose(model, "m2", tmp_path, fake_timer(costs, calls))  # another model: probed again
    assert len(calls) == 2 * n
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)  # another thread count: probed again
    tuning.choose(model, "m1", tmp_path, fake_timer(costs, calls))
    assert len(calls) == 3 * n
    keys = list(json.loads((tmp_path / tuning.CACHE_FILE).read_text()))
    assert len(keys) == 3 and all(cpu.cpu_model() in k and cpu.describe() in k and torch.__version__ in k for k in keys)
    (tmp_path / tuning.CACHE_FILE).write_text("{not json")  # a damaged cache is measured again, not fatal
    assert tuning.choose(model, "m1", tmp_path, fake_timer(costs, calls)) == first and len(calls) == 4 * n


def test_auto_dtype_end_to_end_on_a_local_model(tmp_path, monkeypatch, load_models):
    hf, _, tok = load_models("tiny-qwen3")
    folder = tmp_path / "model"
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path / "cache"))
    model, _ = registry.load_model(str(folder), dtype="auto")  # a real probe: tiny forwards, real timings
    known = json.loads((tmp_path / "cache" / tuning.CACHE_FILE).read_text())
    (choice,) = known.values()
    assert model.embed.weight.dtype == tuning.DTYPES[choice["dtype"]] and model.attention == tuple(choice["attention"])
    assert model.linear == choice["linear"]
    assert all(len(ms) == len(tuning.SHAPES) and min(ms) > 0 for ms in choice["ms"].values())
    forced, _ = registry.load_model(str(folder), dtype="bfloat16")  # forced dtype, probed kernel for it
    assert forced.embed.weight.dtype == torch.bfloat16 and forced.attention == tuple(choice["attention_for"]["bfloat16"])
    assert forced.linear == choice["linear_for"]["bfloat16"]


def test_auto_on_test_models_is_fp32_without_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path))
    model, _ = registry.load_model("tiny-llama", dtype="auto")
    assert model.embed.weight.dtype == torch.float32 and not (tmp_path / tuning.CACHE_FILE).exists()
    with pytest.raises(BebopError, match="unknown dtype"):
        registry.load_model("tiny-llama", dtype="float16")
    assert cpu.cpu_model()


AVX2_MESSAGE = ("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl "
                "and avx512dq")


@pytest.fixture
def avx2_only(monkeypatch):
    """Pretend this CPU is an AMD EPYC with AVX2 only: no native bf16, so no packed bf16 linears, no AMX, and of
    vLLM's kernels only the fp32 ones (what torch's queries answer there, and what vLLM's AVX2 build runs). Runs
    the fallback on every machine, the Intel one with AMX included."""
    monkeypatch.setattr(cpu, "capability", lambda: "AVX2")
    monkeypatch.setattr(cpu, "native_bf16", lambda: False)
    monkeypatch.setattr(cpu, "packs_bf16_linears", lambda: False)
    monkeypatch.setattr(cpu, "amx", lambda: False)
    monkeypatch.setattr(cpu, "amx_bf16_linears", lambda: False)


def local_model(load_models, folder):
    hf, _, tok = load_models("tiny-qwen3")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def test_a_cpu_without_native_bf16_is_probed_for_what_it_runs(avx2_only, load_models, tmp_path, monkeypatch, capsys):
    """An AVX2-only machine: the probe times float32 only (bf16 would run emulated), says why, keys its cache by the
    capability;
    `--dtype bfloat16` loads and generates with plain linears, and a linear told to pack multiplies plainly
    (what a cache copied from an AMX machine would ask for)."""
    from bebop.cli import main
    from bebop.models.kernels import Linear, linear_rows

    folder = local_model(load_models, tmp_path / "model")
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path / "cache"))
    model, _ = registry.load_model(folder, dtype="auto")
    assert "no native bf16" in capsys.readouterr().err
    ((key, choice),) = json.loads((tmp_path / "cache" / tuning.CACHE_FILE).read_text()).items()
    assert "[AVX2 (" in key and "bf16 emulated" in key and choice["capability"] == cpu.describe()
    fp32_kinds = tuning.linear_kinds(torch.float32, torch.device("cpu"))  # plain, packed where torch has it,
    # vLLM's oneDNN matmul where vLLM is installed
    attentions = tuning.attention_kinds(torch.float32, model)
    assert set(choice["ms"]) == {f"float32/{a}/{lin}" for a in attentions for lin in fp32_kinds}
    assert choice["dtype"] == "float32" and set(choice["linear_for"]) == {"float32"}  # bf16 never timed
    assert {kind for _, kind in linear_rows(choice["linear_for"]["float32"])} <= set(fp32_kinds)  # (or a kind per
    # row count, of those)
    assert choice["dropped"] == {}

    forced, _ = registry.load_model(folder, dtype="bfloat16")
    assert forced.embed.weight.dtype == torch.bfloat16 and forced.linear == "plain"
    tokens = torch.tensor([[1, 2, 3, 4]])
    plain = forced.logits(forced(tokens, forced.new_cache(1, 8)))
    for kind in ("packed", "amx", "onednn", "amx:4,onednn"):
        forced.linear = kind
        assert torch.equal(forced.logits(forced(tokens, forced.new_cache(1, 8))), plain)
        assert not any("_packed" in m.__dict__ for m in forced.modules() if isinstance(m, Linear))

    out = tmp_path / "out.jsonl"
    main(["generate", "--model", folder, "--prompt", "Hi", "--max-new-tokens", "6", "--dtype", "bfloat16",
          "--mode", "spec", "--mtp", "random", "--draft-len", "2", "--seed", "0", "--output", str(out)])
    assert len(json.loads(out.read_text())["tokens"]) >= 1


def test_a_kernel_that_raises_in_the_probe_is_dropped_with_a_note(tiny_llama, monkeypatch, capsys):
    """The queries said yes and the kernel raised anyway (a torch build that packs for other CPUs than it
    says): the real probe drops each packed config with one line, no traceback, and chooses among the rest."""
    from bebop.models import kernels

    def refuse(*args):
        raise RuntimeError(AVX2_MESSAGE + "\n(a second line of the message)")

    monkeypatch.setattr(cpu, "packs_bf16_linears", lambda: True)
    monkeypatch.setattr(cpu, "amx_bf16_linears", lambda: False)  # the packed kind is the one on trial
    monkeypatch.setattr(cpu, "onednn_linears", lambda: False)
    monkeypatch.setattr(kernels, "reorder_linear_weight", refuse, raising=False)
    model, _ = tiny_llama
    got = tuning.probe(model, shapes=((1, 1), (2, 2)), repeats=1)
    cpu_device = torch.device("cpu")
    packed = {f"{name}/{a}/packed" for name, d in tuning.DTYPES.items() for a in tuning.ATTENTION_KINDS
              if "packed" in tuning.linear_kinds(d, cpu_device)}  # (fp32 too, where torch has the op)
    assert {"bfloat16/sdpa/packed"} <= packed and set(got["dropped"]) == packed and all(v == "RuntimeError: " + AVX2_MESSAGE for v in got["dropped"].values())
    assert not packed & set(got["ms"]) and got["linear_for"] == {"float32": "plain", "bfloat16": "plain"}
    notes = [line for line in capsys.readouterr().err.splitlines() if "dropped" in line]
    assert len(notes) == len(packed) and all("bebop: dtype probe: dropped " in line for line in notes)
    assert model.linear == "plain" and model.attention == ("sdpa", "sdpa")


def test_a_dtype_that_never_runs_is_not_chosen(tiny_llama, monkeypatch):
    """Every bf16 config raising leaves fp32, and a forced bf16 then keeps the decoder's own kernels; nothing
    running at all is one clear error."""
    model, _ = tiny_llama
    costs = table((1.0, 1.0, 1.0), (0.1, 0.1, 0.1))  # bf16 would win by far, if it ran
    fast = fake_timer(costs)

    def no_bf16(m, batch, new_tokens):
        if m.embed.weight.dtype == torch.bfloat16:
            raise RuntimeError("bf16 refused")
        return fast(m, batch, new_tokens)

    got = tuning.choose(model, registry.probe_name(model.name), registry.cache_dir(), no_bf16)
    assert got["dtype"] == "float32" and set(got["attention_for"]) == set(got["linear_for"]) == {"float32"}
    assert len(got["dropped"]) == len(tuning.ATTENTION_KINDS) * len(tuning.linear_kinds(torch.bfloat16, torch.device("cpu")))
    assert registry.probed_kernels(model, "bfloat16") == (model.attention, model.linear)

    def nothing(m, batch, new_tokens):
        raise RuntimeError("no kernel")

    with pytest.raises(BebopError, match="no kernel of this model ran on this machine"):
        tuning.probe(model, nothing, shapes=((1, 1),), repeats=1)
