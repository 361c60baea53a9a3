"""`--dtype auto`: run the model in bfloat16 where this machine runs it faster than float32, else float32.

Whether bf16 pays depends on the CPU (the same model decoded 2x faster in bf16 on an AMD EPYC with avx512_bf16
and 1.4x slower on an Intel Xeon with AMX), and so do the faster decode attention kernel and whether packed
weights pay (decoder.py), so all are measured: a few interleaved forwards of the actual model, per (dtype,
attention kernel, linear kind), at batch 1 and 16. The answer is cached in the bebop cache dir, keyed by
everything that changes it: CPU model, torch version, model name, thread count (and the accelerator's name when
the model is on one).
Only the model runs in bf16: sampling distributions are computed in fp32 (model.logits, bebop.sampling).
"""

import copy
import json
import math
import platform
import statistics
import time

import torch
from tqdm import tqdm

from bebop.checkpoint import write_text_atomic
from bebop.models.decoder import ATTENTION_KINDS, LINEAR_KINDS, Decoder, packs_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CACHE_FILE = "dtype-probe-v3.json"  # v2: a kernel for one new token and one for several; v3: linear kind
# (batch, new tokens per row) of the probe: plain decoding alone and batched, and a K=3 verification step.
# Batch 16, the smallest batch RL rollouts run at: there the folded kernel took 0.6x SDPA's time for 2-4 new
# tokens per row on this Intel Xeon, at batch 8 the two tied (so a batch-8 probe chose SDPA)
SHAPES = ((1, 1), (16, 1), (16, 4))
PREFIX = 128  # cached tokens per row the probe attends over
REPEATS = 2
# the more precise choice (fp32; SDPA's kernel, whose bf16 scores stay fp32) is kept unless the other is at
# least 5% faster: a probe on a loaded machine should not flip a choice on noise
MARGIN = 0.95


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name", as `lscpu` shows it), else platform's answer."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def probe_key(model_name: str, device: torch.device) -> str:
    where = cpu_model() if device.type == "cpu" else f"{device.type}:{torch.cuda.get_device_name(device)}" \
        if device.type == "cuda" else device.type
    return f"{where} | torch {torch.__version__} | {model_name} | {torch.get_num_threads()} threads"


def time_forward(model: Decoder, batch: int, new_tokens: int) -> float:
    """Seconds of one forward of `new_tokens` tokens per row after PREFIX cached ones (what a decode or
    verification step costs)."""
    device = model.embed.weight.device
    cache = model.new_cache(batch, PREFIX + new_tokens)
    cache.lengths[:] = PREFIX
    tokens = torch.randint(0, model.cfg.vocab_size, (batch, new_tokens), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    model(tokens, cache)
    sync()
    return time.perf_counter() - start


def linear_kinds(dtype: torch.dtype, device: torch.device) -> tuple[str, ...]:
    return LINEAR_KINDS if packs_weights(dtype, device) else ("plain",)


def probe(model: Decoder, timer=time_forward, shapes=SHAPES, repeats: int = REPEATS) -> dict:
    """Time every (dtype, attention kernel, linear kind) on every shape, interleaved (each repetition runs every
    config in a rotated order, after one warm-up pass); each shape's time is its fastest repetition (load from
    other processes only adds time). Per dtype and linear kind, the kernel for one new token is the fastest on
    the shapes with one new token, the kernel for several the fastest on the others (geometric means); per
    dtype, the linear kind is the one whose kernels give the smaller geometric mean over all shapes (packed
    and plain compute the same products, so the faster simply wins); the dtype is then chosen the same way.
    Returns {"dtype", "attention": [one-token kernel, few-token kernel], "linear", "attention_for": {dtype:
    that pair}, "linear_for": {dtype: kind}, "shapes", "ms": {config: [ms per shape]}}."""
    models = {"float32": model if model.embed.weight.dtype == torch.float32 else copy.deepcopy(model).float()}
    models["bfloat16"] = copy.deepcopy(models["float32"]).to(torch.bfloat16)
    device = model.embed.weight.device
    configs = [(d, a, lin) for d in DTYPES for lin in linear_kinds(DTYPES[d], device) for a in ATTENTION_KINDS]
    times = {c: [[] for _ in shapes] for c in configs}
    saved = model.attention, model.linear
    try:
        with tqdm(total=(repeats + 1) * len(configs) * len(shapes), desc="dtype probe", unit="fwd", leave=False) as bar:
            for rep in range(repeats + 1):
                for j, shape in enumerate(shapes):
                    for i in range(len(configs)):
                        d, a, lin = configs[(i + rep + j) % len(configs)]
                        models[d].attention, models[d].linear = (a, a), lin
                        t = timer(models[d], *shape)
                        if rep > 0:  # repetition 0 warms up allocations and kernels
                            times[(d, a, lin)][j].append(t)
                        bar.update(1)
    finally:
        model.attention, model.linear = saved
    ms = {c: [1e3 * min(ts) for ts in times[c]] for c in configs}
    phases = [[j for j, (_, t) in enumerate(shapes) if (t > 1) == several] for several in (False, True)]

    def geomean(xs):
        return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else 1.0

    def kernel(d, lin, phase):  # SDPA, the fused kernel, unless another is clearly faster on this phase's shapes
        score = {a: geomean([ms[(d, a, lin)][j] for j in phase]) for a in ATTENTION_KINDS}
        best = min(score, key=score.get)
        return best if score[best] < MARGIN * score["sdpa"] else "sdpa"

    def overall(d, lin, pair):
        return geomean([ms[(d, pair[shapes[j][1] > 1], lin)][j] for j in range(len(shapes))])

    pairs = {(d, lin): [kernel(d, lin, phase) for phase in phases] for d, _, lin in configs}
    linear = {d: min(linear_kinds(DTYPES[d], device), key=lambda lin: overall(d, lin, pairs[(d, lin)])) for d in DTYPES}
    score = {d: overall(d, linear[d], pairs[(d, linear[d])]) for d in DTYPES}
    pick = "bfloat16" if score["bfloat16"] < MARGIN * score["float32"] else "float32"
    attention_for = {d: pairs[(d, linear[d])] for d in DTYPES}
    return {"dtype": pick, "attention": attention_for[pick], "linear": linear[pick], "attention_for": attention_for,
            "linear_for": linear, "shapes": [list(s) for s in shapes],
            "ms": {f"{d}/{a}/{lin}": ms[(d, a, lin)] for d, a, lin in configs}}


def read_cache(cache_dir) -> dict:
    try:
        return json.loads((cache_dir / CACHE_FILE).read_text())
    except (OSError, ValueError):  # none yet, or unreadable: probe again
        return {}


def choose(model: Decoder, model_name: str, cache_dir, timer=time_forward) -> dict:
    """The probe's answer for this model on this machine: from the cache file, else measured and stored."""
    path = cache_dir / CACHE_FILE
    key = probe_key(model_name, model.embed.weight.device)
    known = read_cache(cache_dir)
    if key not in known:
        known[key] = probe(model, timer)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(known, indent=1))  # a concurrent reader sees the old file or the new
    return known[key]
