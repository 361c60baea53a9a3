"""Per machine and model, the dtype, kernels and compilation a model runs with, chosen by timing them.

`--dtype auto` runs the model in bfloat16 where this machine runs it faster than float32, else float32; which
attention kernel and linear kind are fastest depends on the CPU too (bebop.models.kernels), so all are timed:
a few interleaved forwards of the actual model, per (dtype, attention kernel, linear kind), at batch 1 and 16
(tune), then the linear kinds within 10% of the best (plain included) per row count (row_choice) and, in
compile mode "auto", the compiled step against eager (compile_choice). Only what this machine can run is timed
(bebop.models.cpu), and a kernel that raises anyway is dropped with a note. The answer is cached in the bebop
cache dir (CACHE_FILE), keyed by everything that changes it (cache_key): CPU model and capability, torch
version, model name, thread count (and the accelerator's name when the model is on one). Only the model runs in
bf16: sampling distributions are computed in fp32 (model.logits, bebop.sampling).
"""

import copy
import json
import math
import statistics
import sys
import time

import torch
from tqdm import tqdm

from bebop.io import write_text_atomic
from bebop.errors import BebopError
from bebop.models import DTYPES, cpu
from bebop.models.decoder import Decoder
from bebop.models.kernels import ATTENTION_KINDS, PAGED, amx_weights, onednn_weights, packs_weights, paged_runs

CACHE_FILE = "dtype-probe-v9.json"  # the version grows whenever the answer's fields or meaning change
# (batch, new tokens per row) timed: plain decoding alone and batched, and a K=3 verification step; batch 16 is
# the smallest batch RL rollouts run at
SHAPES = ((1, 1), (16, 1), (16, 4))
PREFIX = 128  # cached tokens per row the probe attends over
REPEATS = 2
# the more precise choice (fp32; SDPA's kernel, whose bf16 scores stay fp32) is kept unless the other is at
# least 5% faster: a probe on a loaded machine should not flip a choice on noise
MARGIN = 0.95
# (batch, new tokens per row) at which the linear kinds near the best are timed against each other when two or
# more run (row_choice): 1, 4, 16, 64 and 256 rows per linear (batch x new tokens): plain decoding at batch 1,
# verification steps of K = 3 at batch 1, 16 and 64
ROW_SHAPES = ((1, 1), (1, 4), (16, 1), (16, 4), (64, 4))
ROW_REPEATS = 5
ROW_CANDIDATE = 0.9  # kinds within 10% of the best single kind over whole forwards compete per row count


def cache_key(model_name: str, device: torch.device) -> str:
    """The cache key: everything the tuning's answer depends on. The CPU's capability is in it, so a cache
    copied from a machine with the same model name but other kernels (a cloud CPU string hides a lot) is
    probed again, not trusted."""
    where = f"{cpu.cpu_model()} [{cpu.describe()}]" if device.type == "cpu" else \
        f"{device.type}:{torch.cuda.get_device_name(device)}" if device.type == "cuda" else device.type
    return f"{where} | torch {torch.__version__} | {model_name} | {torch.get_num_threads()} threads"


def time_forward(model: Decoder, batch: int, new_tokens: int) -> float:
    """Seconds of one forward of `new_tokens` tokens per row after PREFIX cached ones and its logits (what a
    decode or verification step costs; the LM head is a large share of a small model's weights)."""
    device = model.embed.weight.device
    cache = model.new_cache(batch, PREFIX + new_tokens)
    cache.lengths[:] = PREFIX
    tokens = torch.randint(0, model.cfg.vocab_size, (batch, new_tokens), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    model.logits(model(tokens, cache))
    sync()
    return time.perf_counter() - start


def linear_kinds(dtype: torch.dtype, device: torch.device) -> tuple[str, ...]:
    """The linear kinds this machine can run in `dtype` (kernels.LINEAR_KINDS): packed only where oneDNN packs
    it, amx only where AMX and vLLM's CPU kernels are, onednn where vLLM's kernels are (bebop.models.cpu)."""
    return ("plain",) + ("packed",) * packs_weights(dtype, device) + ("amx",) * amx_weights(dtype, device) \
        + ("onednn",) * onednn_weights(dtype, device)


def row_choice(model: Decoder, kinds, default: str, timer=time_forward, repeats: int = ROW_REPEATS) -> tuple[str, dict]:
    """The linear kind for each row count of ROW_SHAPES: `default` (the whole-forward probe's best single kind),
    or another of `kinds` where it is 5% faster there; as a linear kind per row count (kernels.linear_rows),
    e.g. "amx:1,onednn:4,amx:16,onednn"; and the milliseconds measured, {kind: [fastest ms per shape]}. Whole
    forwards (weights stream from memory as in generation; one layer timed again and again keeps its weight in
    the cache and favours other kernels). At each shape the kinds run back to back, and a kind is judged by the
    median over repetitions of its time over the default's in the same repetition: the speed of a shared
    machine drifts by more than these kernels differ (between timings minutes apart), a pair of
    neighbouring forwards much less."""
    times = {k: [[] for _ in ROW_SHAPES] for k in kinds}
    saved = model.linear
    try:
        with tqdm(total=(repeats + 1) * len(ROW_SHAPES) * len(kinds), desc="linear probe", unit="fwd",
                  leave=False) as bar:
            for rep in range(repeats + 1):
                for j, shape in enumerate(ROW_SHAPES):
                    for i in range(len(kinds)):
                        kind = kinds[(i + rep + j) % len(kinds)]
                        model.linear = kind
                        t = timer(model, *shape)
                        bar.update(1)
                        if rep > 0:  # repetition 0 warms up (and lays the weights out for each kind)
                            times[kind][j].append(t)
    finally:
        model.linear = saved
    best = []
    for j in range(len(ROW_SHAPES)):
        ratio = {k: statistics.median(a / b for a, b in zip(times[k][j], times[default][j])) for k in kinds}
        fastest = min(ratio, key=ratio.get)
        best.append(fastest if ratio[fastest] < MARGIN else default)
    parts = []
    for j, kind in enumerate(best):  # a kind's range ends where the next row count wants another kind
        if j + 1 == len(best):
            parts.append(kind)
        elif best[j + 1] != kind:
            parts.append(f"{kind}:{ROW_SHAPES[j][0] * ROW_SHAPES[j][1]}")
    return ",".join(parts), {k: [round(1e3 * min(ts), 2) for ts in v] for k, v in times.items()}


def attention_kinds(dtype: torch.dtype, model: Decoder) -> tuple[str, ...]:
    """The attention kinds to time in `dtype`: every per-phase kernel, and "paged" (vLLM's CPU attention over
    a paged cache, for every phase at once) where it runs (kernels.paged_runs)."""
    runs = paged_runs(dtype, model.embed.weight.device, model.cfg.head_dim)
    return ATTENTION_KINDS + (PAGED,) * runs


def note(text: str) -> None:
    """One line on stderr, above the probe's progress bar."""
    tqdm.write(f"bebop: dtype probe: {text}", file=sys.stderr)


def tune(model: Decoder, timer=time_forward, shapes=SHAPES, repeats: int = REPEATS) -> dict:
    """Time every (dtype, attention kernel, linear kind) this machine offers (linear_kinds) on every shape
    (time_configs) and choose among them (choose_kernels); where two or more linear kinds run near the best in a
    dtype, time them per row count too (choose_rows).
    Returns {"dtype", "attention": [one-token kernel, few-token kernel], "linear", "attention_for": {dtype:
    that pair}, "linear_for": {dtype: kind}, "shapes", "ms": {config: [ms per shape]}, "linear_rows_ms":
    {dtype: {kind: [ms per ROW_SHAPES shape]}}, "capability", "dropped": {config: why}}; a dtype none of whose
    configs ran is absent from attention_for and linear_for."""
    models = {"float32": model if model.embed.weight.dtype == torch.float32 else copy.deepcopy(model).float()}
    models["bfloat16"] = copy.deepcopy(models["float32"]).to(torch.bfloat16)
    device = model.embed.weight.device
    dtypes = list(DTYPES)
    if device.type == "cpu" and not cpu.native_bf16():  # ask first: an emulated path is never timed
        note(f"this CPU ({cpu.describe()}) has no native bf16: float32 only")
        dtypes.remove("bfloat16")
    configs = [(d, a, lin) for d in dtypes for lin in linear_kinds(DTYPES[d], device)
               for a in attention_kinds(DTYPES[d], model)]
    saved = model.attention, model.linear
    try:
        ms, dropped = time_configs(models, configs, timer, shapes, repeats)
    finally:
        model.attention, model.linear = saved
    if not ms:
        raise BebopError(f"no kernel of this model ran on this machine: {'; '.join(dropped.values())}")
    pick, pairs, linear = choose_kernels(ms, shapes)
    attention_for = {d: pairs[(d, linear[d])] for d in linear}
    rows_ms = choose_rows(models, ms, shapes, pairs, linear, timer, saved[0])
    return {"dtype": pick, "attention": attention_for[pick], "linear": linear[pick], "attention_for": attention_for,
            "linear_for": linear, "shapes": [list(s) for s in shapes],
            "ms": {f"{d}/{a}/{lin}": v for (d, a, lin), v in ms.items()}, "linear_rows_ms": rows_ms,
            "capability": cpu.describe(), "dropped": {"/".join(c): why for c, why in dropped.items()}}


probe = tune  # old name, kept for one release


def time_configs(models: dict, configs: list, timer, shapes, repeats: int) -> tuple[dict, dict]:
    """Each config's fastest time per shape, interleaved: each repetition runs every config in a rotated order,
    after one warm-up pass (load from other processes only adds time). A config that raises is dropped with a
    one-line note (a kernel the capability queries allowed but the CPU refused). Returns ({config: [ms per
    shape]}, {dropped config: why})."""
    times = {c: [[] for _ in shapes] for c in configs}
    dropped = {}
    with tqdm(total=(repeats + 1) * len(configs) * len(shapes), desc="dtype probe", unit="fwd", leave=False) as bar:
        for rep in range(repeats + 1):
            for j, shape in enumerate(shapes):
                for i in range(len(configs)):
                    config = configs[(i + rep + j) % len(configs)]
                    bar.update(1)
                    if config in dropped:
                        continue
                    d, a, lin = config
                    models[d].attention, models[d].linear = (a, a), lin
                    try:
                        t = timer(models[d], *shape)
                    except Exception as e:  # noqa: BLE001 -- whatever the kernel raised, it cannot run here
                        dropped[config] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
                        note(f"dropped {'/'.join(config)}: {dropped[config]}")
                        continue
                    if rep > 0:  # repetition 0 warms up allocations and kernels
                        times[config][j].append(t)
    return {c: [1e3 * min(ts) for ts in times[c]] for c in configs if c not in dropped}, dropped


def geomean(xs) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else 1.0


def phase_kernel(ms: dict, d: str, lin: str, phase: list[int]) -> str:
    """SDPA, the fused kernel, unless another is clearly faster on this phase's shapes (indices `phase`)."""
    score = {a: geomean([ms[(d, a, lin)][j] for j in phase]) for a in ATTENTION_KINDS if (d, a, lin) in ms}
    if not score:  # only paged ran
        return PAGED
    best = min(score, key=score.get)
    return best if "sdpa" not in score or score[best] < MARGIN * score["sdpa"] else "sdpa"


def overall(ms: dict, shapes, d: str, lin: str, pair) -> float:
    """The geometric mean over all shapes of (d, lin) with the attention `pair` (one token, several)."""
    return geomean([ms[(d, pair[shapes[j][1] > 1], lin)][j] for j in range(len(shapes))])


def choose_kernels(ms: dict, shapes) -> tuple[str, dict, dict]:
    """Per dtype and linear kind, the kernel for one new token is the fastest on the shapes with one new token,
    the kernel for several the fastest on the others (geometric means); paged attention, which serves both
    phases (its cache layout is its own), replaces that pair where it is 5% faster over all shapes. Per dtype,
    the linear kind is the one whose kernels give the smaller geometric mean over all shapes (packed and plain
    compute the same products, so the faster simply wins); the dtype is then chosen the same way. Returns
    (dtype, {(dtype, linear kind): attention pair}, {dtype: linear kind}) over the dtypes that ran."""
    phases = [[j for j, (_, t) in enumerate(shapes) if (t > 1) == several] for several in (False, True)]
    pairs = {(d, lin): [phase_kernel(ms, d, lin, phase) for phase in phases] for d, _, lin in ms}
    for (d, lin), pair in pairs.items():  # paged attention serves every phase: it replaces the pair or not
        if (d, PAGED, lin) in ms and PAGED not in pair \
                and overall(ms, shapes, d, lin, [PAGED, PAGED]) < MARGIN * overall(ms, shapes, d, lin, pair):
            pairs[(d, lin)] = [PAGED, PAGED]
    ran = [d for d in DTYPES if any(key[0] == d for key in pairs)]
    linear = {d: min((lin for dd, lin in pairs if dd == d), key=lambda lin: overall(ms, shapes, d, lin, pairs[(d, lin)]))
              for d in ran}
    score = {d: overall(ms, shapes, d, linear[d], pairs[(d, linear[d])]) for d in ran}
    if len(score) == 2:
        pick = "bfloat16" if score["bfloat16"] < MARGIN * score["float32"] else "float32"
    else:
        (pick,) = score
    return pick, pairs, linear


def choose_rows(models: dict, ms: dict, shapes, pairs: dict, linear: dict, timer, attention) -> dict:
    """Where two or more of a dtype's linear kinds ran within ROW_CANDIDATE of its best (plain included), they
    are timed against the best at the row counts of ROW_SHAPES (with that dtype's attention) and a count goes
    to another kind where that is 5% faster (row_choice): no one kernel wins at every row count (emulating an
    AVX2-only CPU, plain F.linear was the best single kind, 18% faster at 1 row, and vLLM's oneDNN matmul 7%
    faster at 16). Updates `linear` in place; returns {dtype: {kind: [ms per ROW_SHAPES shape]}}. The models'
    attention is `attention` after."""
    rows_ms = {}
    for d in linear:
        best = overall(ms, shapes, d, linear[d], pairs[(d, linear[d])])  # kinds within 10% of the best take part
        near = [lin for lin in dict.fromkeys(lin for dd, lin in pairs if dd == d)
                if overall(ms, shapes, d, lin, pairs[(d, lin)]) < best / ROW_CANDIDATE]
        if len(near) > 1:
            models[d].attention = tuple(pairs[(d, linear[d])])
            try:
                linear[d], rows_ms[d] = row_choice(models[d], near, linear[d], timer)
            finally:
                models[d].attention = attention
    return rows_ms


def compile_choice(model: Decoder, timer=time_forward, shapes=SHAPES, repeats: int = REPEATS) -> tuple[bool, dict, float]:
    """Whether the compiled decode step (bebop.models.compiled) pays here, for the chosen dtype and kernels:
    eager and compiled forwards timed interleaved on every shape after a first compiled pass that compiles
    them (its seconds are returned: what a process pays once on a cold cache), compiled chosen where its
    geometric mean is 5% below eager's. A compile that raises keeps eager, with a note. Returns (compiled?,
    {"eager": [ms per shape], "compiled": [...]}, compile seconds)."""
    times = {False: [[] for _ in shapes], True: [[] for _ in shapes]}
    start = time.perf_counter()
    try:
        with tqdm(total=(repeats + 1) * 2 * len(shapes), desc="compile probe (compiles first)", unit="fwd",
                  leave=False) as bar:
            for rep in range(repeats + 1):
                for j, shape in enumerate(shapes):
                    for flag in ((True, False) if rep % 2 else (False, True)):
                        model.compiled = flag
                        t = timer(model, *shape)
                        bar.update(1)
                        if rep > 0:
                            times[flag][j].append(t)
                if rep == 0:
                    compile_s = time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 -- whatever the compiler raised, eager stays
        note(f"the compiled step does not run here, eager stays: {type(e).__name__}: {(str(e).splitlines() or [''])[0]}")
        return False, {}, 0.0
    finally:
        model.compiled = False
    ms = {("compiled" if flag else "eager"): [round(1e3 * min(ts), 2) for ts in v] for flag, v in times.items()}
    return geomean(ms["compiled"]) < MARGIN * geomean(ms["eager"]), ms, round(compile_s, 1)


def read_cache(cache_dir) -> dict:
    try:
        return json.loads((cache_dir / CACHE_FILE).read_text())
    except (OSError, ValueError):  # none yet, or unreadable: probe again
        return {}


def choose(model: Decoder, model_name: str, cache_dir, timer=time_forward, compile_mode: str = "0") -> dict:
    """The probe's answer for this model on this machine: from the cache file, else measured and stored."""
    path = cache_dir / CACHE_FILE
    key = cache_key(model_name, model.embed.weight.device)
    known = read_cache(cache_dir)
    changed = key not in known
    if changed:
        known[key] = tune(model, timer)
    choice = known[key]
    if compile_mode == "auto" and "compiled" not in choice:  # timed once asked for
        chosen = copy.deepcopy(model).to(DTYPES[choice["dtype"]])  # the compiled step, as it would run
        chosen.attention, chosen.linear = tuple(choice["attention"]), choice["linear"]
        choice["compiled"], choice["compiled_ms"], choice["compile_s"] = compile_choice(chosen, timer)
        changed = True
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(known, indent=1))  # a concurrent reader sees the old file or the new
    return known[key]
