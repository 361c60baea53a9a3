"""The engine: batched generation, plain or speculative, with continuous batching (`generate`)."""

from bebop.engine.generation import MODES, Generation, Rollout, SpecStats, generate

__all__ = ["MODES", "Generation", "Rollout", "SpecStats", "generate"]
