"""The engine: batched generation, plain or speculative, with continuous batching (`generate`). The names below
are imported on first use, so that importing a light module of the engine (modes, memory) stays light."""

from bebop.engine.modes import MODES

__all__ = ["MODES", "Generation", "Rollout", "SpecStats", "generate"]


def __getattr__(name: str):
    if name in ("Generation", "Rollout", "generate"):
        from bebop.engine import generation

        return getattr(generation, name)
    if name == "SpecStats":
        from bebop.engine.stats import SpecStats

        return SpecStats
    raise AttributeError(f"module 'bebop.engine' has no attribute '{name}'")
