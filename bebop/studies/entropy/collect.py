"""Collecting the entropy study's trace: the engine run at each temperature with its per-position trace on."""

import numpy as np
from tqdm import tqdm

from bebop.engine.generation import generate
from bebop.errors import BebopError
from bebop.sampling import SamplingParams


def collect(target, mtp, prompts, temperatures, draft_len, max_new_tokens=64, seed=0, policy="base",
            mode="spec", progress=True):
    """Run the engine at each temperature with trace=True and return one table (TABLE_COLUMNS plus `row`)."""
    parts = []
    for T in tqdm(temperatures, desc=f"entropy study ({policy})", disable=not progress):
        g = generate(target, prompts, max_new_tokens, SamplingParams(T), mode=mode, draft=mtp, draft_len=draft_len,
                     seed=seed, trace=True)
        if g.trace is None:
            continue
        n = len(g.trace["depth"])
        label = f"T={T:g}" if policy == "base" else f"{policy},T={T:g}"
        parts.append({**g.trace, "run": np.array([label] * n), "temperature": np.full(n, float(T)),
                      "policy": np.array([policy] * n)})
    if not parts:
        raise BebopError("no draft positions were examined (draft length 0 or no tokens generated)")
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
