"""The target model: a decoder-only transformer (decoder), its kernels (kernels), KV cache (cache), compiled
step (compiled), per-machine tuning (tuning, cpu) and loading by name (registry)."""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # the dtypes a model runs in, by name
