"""vLLM's CPU attention over a paged cache with T new queries a row: what a verify step's attention costs
against a plain step's (T = 1), per layer, at 16 and 64 rows after 300 cached tokens (smollm2-135m's heads).

    python examples/paged_attention_queries.py

Needs vLLM's CPU kernels (bebop.models.cpu.vllm_cpu_attention) and a bf16 cache; prints the median of 30 calls
per shape, with and without vLLM's split-KV schedule (its default in its own runner).
"""

import time

import torch

import bebop.models.kernels as kernels
from bebop.models import cpu
from bebop.models.cache import KVCache

HEADS, KV_HEADS, HEAD_DIM, CACHED = 9, 3, 64, 300


def median_ms(batch: int, T: int, split_kv: bool, calls: int = 30) -> float:
    cache = KVCache(1, batch, KV_HEADS, CACHED + 8, HEAD_DIM, dtype=torch.bfloat16, paged=True)
    cache.k[0].normal_()
    cache.v[0].normal_()
    cache.lengths.fill_(CACHED)
    step = kernels.PagedStep.build(cache, cache.lengths.unsqueeze(1) + torch.arange(T), HEADS)
    if split_kv:
        step.schedule = torch.ops._C.get_scheduler_metadata(batch, HEADS, KV_HEADS, HEAD_DIM, step.seq_lens, cache.dtype,
                                                            step.query_start, True, -1, step.isa, True, None, "auto")
    q = torch.randn(batch, HEADS, T, HEAD_DIM, dtype=torch.bfloat16)
    k, v = torch.randn(batch, KV_HEADS, T, HEAD_DIM, dtype=torch.bfloat16), torch.randn(batch, KV_HEADS, T, HEAD_DIM, dtype=torch.bfloat16)
    times = []
    for i in range(calls + 3):  # (3 warm-up calls)
        start = time.perf_counter()
        step.attend(q, k, v, cache.k[0], cache.v[0])
        if i >= 3:
            times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def main():
    if not cpu.vllm_cpu_attention():
        raise SystemExit("vLLM's CPU attention kernels are not loaded here")
    print(f"{cpu.cpu_model()} [{cpu.describe()}], {torch.get_num_threads()} threads; ms a layer, {CACHED} cached tokens")
    for batch in (16, 64):
        for split_kv in (False, True):
            cells = " ".join(f"T={T}: {median_ms(batch, T, split_kv):.3f}" for T in (1, 2, 3, 5))
            print(f"{batch:3d} rows, split KV {'on ' if split_kv else 'off'}: {cells}", flush=True)


if __name__ == "__main__":
    main()
