"""`bebop demo`'s settings: plain defaults in one place, importable without torch (the parser reads them)."""

from dataclasses import dataclass

from bebop.rl.config import RLConfig


@dataclass
class DemoConfig:
    """What the demo runs: small enough for a few minutes on 2 cores of an AVX2-only CPU."""
    model: str = "smollm2-135m"
    task: str = "arithmetic"
    rounds: int = 2  # interleaved rounds (ar then spec, spec then ar); each runs `steps_per_round` steps of each run
    steps_per_round: int = 3
    prompts_per_step: int = 2
    num_generations: int = 4
    max_completion_length: int = 64
    draft_len: int = 2
    eval_prompts: int = 8  # evaluated before the first round and after each
    exactness_samples: int = 300
    seed: int = 0
    device: str = "auto"

    def rl(self, rollout: str) -> RLConfig:
        return RLConfig(model=self.model, device=self.device, task=self.task, steps=self.rounds * self.steps_per_round,
                        prompts_per_step=self.prompts_per_step, num_generations=self.num_generations,
                        max_completion_length=self.max_completion_length, eval_prompts=self.eval_prompts,
                        rollout=rollout, draft_len=self.draft_len, max_draft_len=self.draft_len, async_mode="off",
                        draft_strategy="frozen", save_every=self.steps_per_round, seed=self.seed).validate()
