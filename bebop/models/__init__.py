"""The target model: a decoder-only transformer (decoder), its kernels (kernels), KV cache (cache), compiled
step (compiled), per-machine tuning (tuning, cpu) and loading by name (registry)."""

DTYPE_NAMES = ("float32", "bfloat16")  # the dtypes a model runs in, by name (no torch: the parser reads them)


def __getattr__(name: str):
    if name == "DTYPES":  # name -> torch dtype
        import torch

        return {n: getattr(torch, n) for n in DTYPE_NAMES}
    raise AttributeError(f"module 'bebop.models' has no attribute '{name}'")
