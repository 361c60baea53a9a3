"""A compiled decode and verify step: torch.compile of the target's embedding and layer stack over its static
KV cache (Decoder.forward with `compiled` set, up to DECODE_MAX_T new tokens per row), as gpt-fast compiles its
one-token decode step and vLLM its forward. Off unless asked for (registry.load_model's `compile`, COMPILE_MODES):
"auto" has the tuning (bebop.models.tuning) time it against eager and keep it where it is 5% faster, "1"
turns it on, "0" keeps eager.

Shapes are dynamic: one graph serves every batch size, number of new tokens and cache length between two of the
row-count bounds of the layers' kernels (kernels.linear_rows), so a generation meets up to one graph per kernel
range. That is over a paged cache; elsewhere torch also specialises size 1 (one row, one new token) as it does
by default (sizes_of_one_specialised). Each compiles once per process on first use, with a line on stderr
saying so and how long it took; inductor's graph cache, kept in bebop's cache dir, makes a later process load
the compiled code instead of building it. Every compiled call runs under its own settings (compile_settings);
nothing of torch's configuration changes for the process.

What makes the compiled step compute what eager computes (tests/models/test_compiled.py):
- vLLM's CPU kernels (bebop.models.cpu) write into a buffer they are given and return nothing: that is all
  the compiler needs to know of them (register_kernels). Paged attention is one opaque op
  (kernels.paged_attention_op), since its kernels' registration would have the compiler trace into them.
- each layer's KV buffer is its own allocation (cache.KVCache): writes through views of one base were
  miscompiled.
- the weights' fast copies (kernels.Linear) are rebuilt where stale before every compiled call, outside the
  graph, which reads them as they are.
"""

import contextlib
import functools
import os
import sys
import time

import torch
from tqdm import tqdm

from bebop.models import cpu
from bebop.models.kernels import DECODE_MAX_T, PAGED, Linear, linear_rows

PAGE_OR_MORE = 32  # warm-up caches: positions (a paged cache's block)

WRITES_INTO_BUFFER = ("weight_packed_linear", "onednn_mm", "rms_norm")  # vLLM's kernels the layers call
VLLM_OPS = False  # cpu.vllm_cpu_ops(), as the compiled code reads it (register_kernels)


COMPILE_MODES = ("0", "auto", "1")  # eager, as the tuning decides, compiled (registry.load_model's `compile`)
INDUCTOR_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"
RECOMPILE_LIMIT = 256  # graphs per function: a generation meets a handful, a test session or a tuning dozens
ACCUMULATED_RECOMPILE_LIMIT = 4096


def wanted(mode: str, timed_faster: bool) -> bool:
    """Whether a model loaded in compile `mode` (COMPILE_MODES) runs compiled, given whether the tuning found the
    compiled step faster (`timed_faster`, False if it was not timed)."""
    return mode == "1" or (mode == "auto" and timed_faster)


def use_bebop_inductor_cache() -> None:
    """Inductor's compiled code goes next to bebop's other caches (~/.cache/bebop/inductor or
    $BEBOP_CACHE/inductor), unless the user chose a directory. Importing torch._dynamo writes torch's default
    into the variable, so that default counts as no choice."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # (imports torch._dynamo)

    current = os.environ.get(INDUCTOR_CACHE_VAR)
    if current is None or current == os.path.abspath(default_cache_dir()):
        os.environ[INDUCTOR_CACHE_VAR] = os.path.join(
            os.environ.get("BEBOP_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "bebop")), "inductor")


def compile_settings(model):
    """The settings every compiled call runs under (tracing happens inside a call), for this call only:
    - recompile limits high, and hitting one raises: past the limit torch would run eagerly without a word;
    - no "duck sizing" (sizes equal when first traced made one symbol): the warm-up's cache had as many blocks
      as its batch had rows + 1, and every real generation then recompiled on that guard;
    - Python floats (the norms' eps) as constants: traced as symbols, the one vLLM's rms_norm takes could not
      become a tensor, and dynamo restarted its analysis after a whole inductor compile;
    - sizes of 1 traced as any other size where this model's graphs allow it (sizes_of_one_specialised)."""
    settings = contextlib.ExitStack()
    settings.enter_context(torch._dynamo.config.patch(
        recompile_limit=max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT),
        accumulated_recompile_limit=max(torch._dynamo.config.accumulated_recompile_limit,
                                        ACCUMULATED_RECOMPILE_LIMIT),
        fail_on_recompile_limit_hit=True, specialize_float=True))
    settings.enter_context(torch.fx.experimental._config.patch(
        use_duck_shape=False, backed_size_oblivious=not sizes_of_one_specialised(model)))
    return settings


@functools.cache
def register_kernels() -> None:
    """The compiler's view of vLLM's CPU kernels: each fills its first argument and returns nothing."""
    global VLLM_OPS
    VLLM_OPS = cpu.vllm_cpu_ops()
    if not VLLM_OPS:
        return
    for name in WRITES_INTO_BUFFER:
        if hasattr(torch.ops._C, name):
            torch.library.register_fake(f"_C::{name}")(lambda *args: None)


@functools.cache
def compiled(fn):
    """`fn` compiled once per process (every model and shape shares it; torch keys graphs by their guards)."""
    register_kernels()
    use_bebop_inductor_cache()
    return torch.compile(fn, dynamic=True, fullgraph=True)


def fast_linears(model) -> list:
    """The model's linears that multiply with a fast kernel's copy of their weight (looked up once)."""
    found = model.__dict__.get("_fast_linears")
    if found is None or found[0] != model.linear:
        found = model.__dict__["_fast_linears"] = (
            model.linear, [m for m in model.modules() if isinstance(m, Linear) and m.kind != "plain"])
    return found[1]


def refresh_fast_weights(model) -> None:
    """Rebuild every stale fast copy (the weights changed in place: an optimiser step, a weight sync, or were
    replaced). A stamp of the weights' versions decides, a few microseconds where checking every copy of
    every kind costs a millisecond a forward."""
    linears = fast_linears(model)
    stamp = tuple((id(m.weight), m.weight._version, None if m.bias is None else m.bias._version) for m in linears)
    if model.__dict__.get("_fast_stamp") == stamp:
        return
    for m in linears:
        for _, kind in m.rows:
            m.fast(kind)
    model.__dict__["_fast_stamp"] = stamp


_seen: set = set()


def sizes_of_one_specialised(model) -> bool:
    """Whether torch compiles one row, and one new token, apart (its default): for every model but one with a
    paged cache. With a paged cache sizes of 1 are traced as any other size (backed_size_oblivious), and one
    graph serves every shape between two of the linear kinds' row-count bounds: 4 graphs in a generation at
    16 rows, where there were 8-11. Traced so, sizes are taken to be >= 2, and anything whose layout depends on
    a size being 1 guards and splits the graphs again (decoder.apply_rope, kernels.paged_attention_op). On the
    SDPA path inductor's layout check for the attention's inputs fails on such sizes, so it keeps the default."""
    return model.attention[0] != PAGED


def shape_class(model, B: int, T: int, capture: tuple[int, ...] = ()) -> tuple:
    """What torch compiles a graph apart for, roughly: the model's dtype and kernels, one row or more and one new
    token or more (sizes_of_one_specialised), and the row-count ranges of its linear kinds
    (kernels.linear_rows)."""
    known = model.__dict__.get("_row_bounds")
    if known is None or known[0] != model.linear:
        known = model.__dict__["_row_bounds"] = (
            model.linear, [upto for upto, _ in linear_rows(model.linear) if upto != float("inf")])
    ones = (B == 1, T == 1) if sizes_of_one_specialised(model) else ()
    return (model.embed.weight.dtype, model.attention, model.linear, id(model.cfg), *ones,
            tuple(B * T <= upto for upto in known[1]), tuple(capture))


def layers(model, fn):
    """`fn` (decoder.run_layers) compiled, after the fast weights are made current; the first call of a new
    shape class outside warm_up says that it compiles, and how long that took."""
    refresh_fast_weights(model)
    step = compiled(fn)

    def run(model, tokens, *args):
        # (a step that drafts fewer than the most passes a view of its token buffer; the graphs are guarded on
        # strides, so a view would compile one of its own inside the generation. A copy, as .contiguous()
        # keeps the stride of a size-1 view)
        tokens = tokens.clone(memory_format=torch.contiguous_format)
        key = shape_class(model, *tokens.shape, args[-1])  # (the last argument: the captured layers)
        with compile_settings(model):  # (read only while a graph is traced, but any call may trace one)
            if key in _seen:
                return step(model, tokens, *args)
            print(f"bebop: compiling the decode step for {tokens.shape[0]} row(s) x {tokens.shape[1]} token(s) "
                  "(once per process and shape class; cached on disk)", file=sys.stderr, flush=True)
            start = time.perf_counter()
            out = step(model, tokens, *args)
        _seen.add(key)
        print(f"bebop: compiled in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        return out

    return run


@torch.inference_mode()
def warm_up(model, batch: int, max_new: int, capture: tuple[int, ...] = ()) -> None:
    """Compile, up front and on a progress bar, every shape class that forwards of up to `batch` rows and
    `max_new` new tokens per row meet (a generation's rows shrink one by one as they finish), capturing the
    layers `capture` (an EAGLE-3 draft's features), so that no compile lands inside the timed or
    latency-bound part of a run. Each class once per process."""
    todo = {}
    for B in range(1, batch + 1):
        for T in range(1, min(max_new, DECODE_MAX_T) + 1):
            todo.setdefault(shape_class(model, B, T, capture), (B, T))
    todo = {k: bt for k, bt in todo.items() if k not in _seen}
    if not todo:
        return
    device = model.embed.weight.device
    for key, (B, T) in tqdm(todo.items(), desc="compiling the decode step", unit="graph", leave=False):
        cache = model.new_cache(B, 2 * PAGE_OR_MORE)
        cache.lengths[:] = 1
        _seen.add(key)  # (the bar says it: no line of its own)
        model(torch.zeros(B, T, dtype=torch.long, device=device), cache, capture)
