"""`bebop bench`: throughput and acceptance of each mode, as ratios measured in one process.

Machines are shared and noisy, so the modes are interleaved (every repetition runs every batch size and
mode, in a rotated order) and tokens/s is total tokens over total time across repetitions; the speedup of a
mode is its tokens/s over `ar`'s from the same run. By default a request stops at EOS, as RL rollouts do, and
tokens/s counts the tokens actually produced (every mode gets the same prompts and seeds); acceptance is then
measured only on text the model itself produced. `ignore_eos` (vLLM's --ignore-eos) makes every row generate
exactly max_new_tokens instead, so all modes do the same amount of work.
`hf` is transformers' own `generate` on the same prompts and settings, in the same dtype. `vllm` is vLLM's
plain decoding, `vllm-spec` vLLM with the draft's EAGLE-3 export and `vllm-ngram` vLLM's n-gram drafter (the
prompt's and the request's own text, no model), each an engine kept alive in its own
process (bebop.backends.vllm.engine.VllmEngine) and timed by its own `generate` call: same prompts (chat template),
seeds, EOS handling and dtype; while one side runs the other waits, so each has the machine's cores.
A bebop mode with the suffix `-compiled` (`ar-compiled`, `spec-compiled`) runs it on the compiled decode and
verify step (bebop.models.compiled), interleaved with the eager modes of the same run, which then run eager
whatever BEBOP_COMPILE says: the comparison that decides whether compiling pays in the engine.
Every figure is recorded with what it depends on (`environment`).
"""

import time

import torch
from tqdm import tqdm

from bebop.drafts.hybrid import model_of
from bebop.engine.draft_len import probe_buckets
from bebop.engine.generation import DEFAULT_MAX_DRAFT_LEN, generate
from bebop.engine.stats import SpecStats
from bebop.models import cpu, devices
from bebop.sampling import SamplingParams

COMPILED = "-compiled"  # the mode suffix for the compiled step


def environment(model) -> dict:
    """What a throughput figure depends on: the dtype, the decode attention kernels in use (for one new token
    per row, for several) and the linear kind, the device (a GPU's name, or cpu), the CPU and what it can run
    (bebop.models.cpu), threads."""
    device = model.embed.weight.device
    return {"dtype": str(model.embed.weight.dtype).removeprefix("torch."), "device": devices.describe(device), "attention": list(model.attention),
            "linear": model.linear, "compiled": model.compiled, "cpu": cpu.cpu_model(), "cpu_capability": cpu.describe(),
            "threads": torch.get_num_threads(), "torch": torch.__version__}


def hf_generate(hf_model, tokenizer, prompts, max_new_tokens, params: SamplingParams, seed: int,
                eos_ids: list[int]) -> int:
    """transformers' generate, left-padded as it requires; returns the number of new tokens produced (up to and
    including each row's first EOS, as our engine counts them). `eos_ids` [] ignores EOS (fixed length)."""
    torch.manual_seed(seed)
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=hf_model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=hf_model.device)
    sampling = dict(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k) \
        if params.temperature > 0 else dict(do_sample=False)
    stop = dict(eos_token_id=eos_ids) if eos_ids else dict(min_new_tokens=max_new_tokens)
    new = hf_model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad, **stop,
                            **sampling)[:, width:]
    if not eos_ids:
        return new.numel()
    is_eos = torch.isin(new, torch.tensor(eos_ids, device=new.device))
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])  # finished rows are padded
    return int(first.sum())


def run_bench(model, prompts: list[list[int]], batch_sizes: list[int], modes: list[str], draft_len: int,
              params: SamplingParams, max_new_tokens: int, seed: int = 0, repeats: int = 3, mtp=None,
              hf_model=None, tokenizer=None, ignore_eos: bool = False, vllm: dict | None = None) -> list[dict]:
    """`vllm`: {"vllm": VllmEngine, "vllm-spec": VllmEngine, "vllm-ngram": VllmEngine} for the vLLM modes
    requested."""
    eos_ids = [] if ignore_eos else list(model.eos_ids)
    loaded = model.compiled
    compared = any(m.endswith(COMPILED) for m in modes)  # then the other modes run eager

    def run(mode, bs, rep, max_new_tokens=max_new_tokens):
        # each repetition takes the next prompts (every mode gets the same ones): at batch 1 a single prompt
        # would make acceptance a figure about that one prompt
        batch = [prompts[(rep * bs + i) % len(prompts)] for i in range(bs)]
        start = time.perf_counter()
        if mode == "hf":
            tokens, stats = hf_generate(hf_model, tokenizer, batch, max_new_tokens, params, seed + rep, eos_ids), None
        elif mode in (vllm or {}):
            r = vllm[mode].generate(batch, max_new_tokens, params.temperature, params.top_p, params.top_k,
                                    seeds=[seed + rep * bs + i for i in range(bs)], ignore_eos=ignore_eos)
            stats = SpecStats.from_vllm(r) if r["drafts"] else None
            return r["seconds"], sum(map(len, r["tokens"])), stats
        else:
            model.compiled = mode.endswith(COMPILED) if compared else loaded
            try:
                g = generate(model, batch, max_new_tokens, params, mode=mode.removesuffix(COMPILED), draft=mtp,
                             draft_len=draft_len, seed=seed + rep, eos_ids=eos_ids)
            finally:
                model.compiled = loaded
            tokens, stats = g.stats.tokens, g.stats
        return time.perf_counter() - start, tokens, stats

    for bs in batch_sizes:  # warm-up: first calls at a batch size pay for allocation, lazy initialisation and,
        for mode in modes:  # in vLLM and the -compiled modes, compiling for that size
            run(mode, bs, 0, max_new_tokens=min(max_new_tokens, 8))
    if draft_len == "auto" and any(m.startswith("spec") for m in modes):  # and auto's one-off cost probes
        # (a hybrid steps at its trained draft's costs)
        probe_buckets(model, model_of(mtp) or mtp, max(batch_sizes), DEFAULT_MAX_DRAFT_LEN)
    acc = {(bs, m): {"time": 0.0, "tokens": 0, "stats": SpecStats()} for bs in batch_sizes for m in modes}
    with tqdm(total=repeats * len(batch_sizes) * len(modes), desc="bench", unit="run") as bar:
        for rep in range(repeats):
            for bs in batch_sizes:
                for i in range(len(modes)):
                    mode = modes[(i + rep) % len(modes)]  # rotate so no mode always runs first
                    dt, tokens, stats = run(mode, bs, rep)
                    a = acc[(bs, mode)]
                    a["time"] += dt
                    a["tokens"] += tokens
                    if stats is not None:
                        a["stats"].add(stats)
                    bar.update(1)
    results = []
    for bs in batch_sizes:
        ar = acc.get((bs, "ar"))
        for mode in modes:
            a = acc[(bs, mode)]
            s = a["stats"]
            tps = a["tokens"] / a["time"]
            results.append({
                "mode": mode, "batch_size": bs,
                "draft_len": (s.draft_len if mode.startswith("vllm-") else draft_len) if "spec" in mode or
                mode == "vllm-ngram" else 0,
                "temperature": params.temperature, "tokens_per_s": tps,
                "speedup_vs_ar": tps / (ar["tokens"] / ar["time"]) if ar else None,
                "acceptance_rate": s.acceptance_rate, "mean_acceptance_length": s.mean_acceptance_length,
                "per_position_acceptance": s.per_position_acceptance, "mean_entropy": s.mean_entropy,
                "tokens": a["tokens"], "seconds": a["time"], "repeats": repeats, "ignore_eos": ignore_eos,
                "mean_tokens_per_request": a["tokens"] / (bs * repeats),
            })
    return results


def format_table(results: list[dict]) -> str:
    def f(x, spec="{:.3f}"):
        return "-" if x is None else spec.format(x)

    head = f"{'mode':<12}{'batch':>6}{'K':>5}{'T':>5}{'tok/s':>9}{'vs ar':>7}{'accept':>8}{'mean len':>9}" \
           f"{'entropy':>8}  per-position acceptance"
    lines = [head, "-" * len(head)]
    for r in results:
        ppa = " ".join(f"{x:.2f}" for x in r["per_position_acceptance"]) or "-"
        lines.append(f"{r['mode']:<12}{r['batch_size']:>6}{r['draft_len']!s:>5}{r['temperature']:>5.2g}"
                     f"{r['tokens_per_s']:>9.1f}{f(r['speedup_vs_ar'], '{:.2f}x'):>7}{f(r['acceptance_rate']):>8}"
                     f"{f(r['mean_acceptance_length'], '{:.2f}'):>9}{f(r['mean_entropy'], '{:.2f}'):>8}  {ppa}")
    return "\n".join(lines)
