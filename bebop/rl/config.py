"""`bebop rl` options as one dataclass: the single source of defaults (the CLI reads them from here).
Names follow TRL's GRPOConfig where TRL has the option."""

import os
import warnings
from dataclasses import InitVar, dataclass

from bebop.engine.modes import MODES as ROLLOUTS
from bebop.models import DTYPE_NAMES
from bebop.errors import BebopError

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
BACKENDS = ("bebop", "vllm")
DRAFT_STRATEGIES = ("frozen", "online-ce", "online-kl", "online-e2e-tv")
ASYNC_MODES = ("off", "one-step")
SCALE_REWARDS = ("group", "batch", "none")
AUTOCAST = ("auto", "bf16", "off")
DTYPES = tuple(sorted(DTYPE_NAMES))  # --rollout-dtype's names: bfloat16, float32
# RLConfig fields' old names -> their names now (a run's config.json before the rename has the old ones)
RENAMED_FIELDS = {"mtp": "draft", "mtp_strategy": "draft_strategy", "mtp_learning_rate": "draft_learning_rate"}


@dataclass
class RLConfig:
    model: str = "smollm2-135m"
    device: str = "auto"  # auto: a CUDA GPU where torch sees one, else the CPU (bebop.models.devices)
    draft: str | None = None  # checkpoint path or EAGLE-3 directory, 'random', 'history' (earlier rollouts),
    # 'hybrid' (the shipped draft and a history, per row), or None = the model's shipped draft
    task: str = "arithmetic"
    difficulty: str | None = None  # the task's default level if None
    steps: int = 20
    prompts_per_step: int = 4
    num_train_prompts: int = 0  # the training prompts, taken in turn (epochs); 0 = steps x prompts_per_step, each once
    num_generations: int = 4  # G: completions per prompt (one GRPO group)
    max_completion_length: int = 96
    temperature: float = 1.0
    learning_rate: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    beta: float = 0.0  # KL to the frozen initial policy; 0 = no reference model (TRL's default)
    epsilon: float = 0.2  # clip range below 1
    epsilon_high: float | None = None  # clip range above 1; None = epsilon (DAPO's paper uses 0.28)
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    num_iterations: int = 1  # policy updates per batch of rollouts (TRL's mu)
    importance_sampling_cap: float = 3.0  # truncated IS between rollout and training log-probs (TRL's clip_max)
    micro_batch_size: int = 4  # sequences per forward/backward; gradients accumulate over the batch
    autocast: str = "auto"  # bf16 autocast over fp32 master weights: auto = whichever a short probe finds faster
    rollout: str = "spec"
    rollout_backend: str = "bebop"  # bebop's engine, or vLLM (bebop.backends.vllm.worker; EAGLE-3 drafts only)
    ray: str | None = None  # None: no Ray; "local": start a local cluster; else an address to join ("auto")
    rollout_workers: int = 1  # rollout actors under Ray, the thread budget split between them
    draft_len: int | str = "auto"  # drafts per step, or "auto": chosen every step by cost (bebop.engine.draft_len)
    max_draft_len: int = 3  # the largest K "auto" may pick
    draft_strategy: str = "frozen"  # keep the pre-RL draft, or train it online on each step's rollouts
    draft_learning_rate: float = 1e-4  # AdamW's, for an online draft strategy
    async_mode: str = "off"
    rollout_dtype: str = "auto"  # auto: bf16 on a GPU, else the dtype the --dtype auto probe chose on this CPU
    threads: int = 0  # total torch threads; 0 = the CPUs this process may use. one-step splits them
    eval_every: int = 0  # 0 = only before and after the run
    eval_prompts: int = 32
    save_every: int = 1
    seed: int = 0
    # the fields' old names (RENAMED_FIELDS), accepted for one release with a DeprecationWarning
    mtp: InitVar[str | None] = None
    mtp_strategy: InitVar[str | None] = None
    mtp_learning_rate: InitVar[float | None] = None

    def __post_init__(self, mtp, mtp_strategy, mtp_learning_rate):
        for old, value in (("mtp", mtp), ("mtp_strategy", mtp_strategy), ("mtp_learning_rate", mtp_learning_rate)):
            if value is not None:
                warnings.warn(f"RLConfig({old}=...) is now RLConfig({RENAMED_FIELDS[old]}=...); {old}= goes in the "
                              "next release", DeprecationWarning, stacklevel=3)
                setattr(self, RENAMED_FIELDS[old], value)

    @property
    def clip_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def train_prompts(self) -> int:
        """How many training prompts the run takes in turn (num_train_prompts, or each step's own)."""
        return self.num_train_prompts or self.steps * self.prompts_per_step

    @property
    def draft_depth(self) -> int:
        """The deepest draft a rollout makes: what an online MTP strategy trains to (a fixed K, or auto's most)."""
        return self.max_draft_len if self.draft_len == "auto" else self.draft_len

    def total_threads(self) -> int:
        return self.threads or len(os.sched_getaffinity(0))

    def validate(self) -> "RLConfig":
        choices = {"loss_type": LOSS_TYPES, "rollout": ROLLOUTS, "rollout_backend": BACKENDS, "draft_strategy": DRAFT_STRATEGIES,
                   "async_mode": ASYNC_MODES, "scale_rewards": SCALE_REWARDS, "autocast": AUTOCAST,
                   "rollout_dtype": ("auto", *DTYPES)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise BebopError(f"--{flag(name)} must be one of {', '.join(allowed)}, got '{getattr(self, name)}'")
        for name in ("steps", "prompts_per_step", "max_completion_length", "micro_batch_size", "num_iterations",
                     "eval_prompts", "save_every"):
            if getattr(self, name) < 1:
                raise BebopError(f"--{flag(name)} must be >= 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise BebopError(f"--num-generations must be >= 2 (GRPO compares completions within a group), "
                             f"got {self.num_generations}")
        for name in ("learning_rate", "temperature", "importance_sampling_cap"):
            if not getattr(self, name) > 0:
                raise BebopError(f"--{flag(name)} must be > 0, got {getattr(self, name)}")
        for name in ("beta", "epsilon", "weight_decay", "draft_learning_rate", "eval_every", "threads", "max_grad_norm",
                     "num_train_prompts"):
            if not getattr(self, name) >= 0:
                raise BebopError(f"--{flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.epsilon_high is not None and not self.epsilon_high >= 0:
            raise BebopError(f"--epsilon-high must be >= 0, got {self.epsilon_high}")
        if self.draft_len != "auto" and (isinstance(self.draft_len, bool) or not isinstance(self.draft_len, int)):
            raise BebopError(f"--draft-len must be an integer or 'auto', got {self.draft_len!r}")
        if self.rollout != "ar" and self.draft_len != "auto" and self.draft_len < 1:
            raise BebopError(f"--draft-len must be >= 1 or 'auto' for --rollout {self.rollout}, got {self.draft_len}")
        if self.max_draft_len < 1:
            raise BebopError(f"--max-draft-len must be >= 1, got {self.max_draft_len}")
        if self.rollout_backend == "vllm" and self.rollout != "ar" and self.draft_len == "auto":
            raise BebopError("--rollout-backend vllm needs a fixed --draft-len (vLLM's num_speculative_tokens; "
                             "it has no automatic K)")
        if self.rollout == "ar" and self.draft_strategy != "frozen":
            raise BebopError(f"--draft-strategy {self.draft_strategy} needs a speculative --rollout (spec or spec-greedy)")
        if self.draft in ("history", "hybrid"):  # (a table of earlier rollouts, held by the worker; a hybrid's
            # trained draft stays frozen)
            if self.rollout_backend == "vllm":
                raise BebopError(f"--draft {self.draft} drafts in bebop's engine only (--rollout-backend bebop); vLLM's "
                                 "own n-gram drafter is its speculative_config")
            if self.draft_strategy != "frozen":
                raise BebopError(f"--draft {self.draft} drafts with a frozen draft only: --draft-strategy "
                                 f"{self.draft_strategy} trains a draft model (pass --draft PATH)")
            if self.rollout_workers > 1:
                raise BebopError(f"--draft {self.draft} needs one rollout worker: each would keep a history of its own")
        if self.rollout_workers < 1:
            raise BebopError(f"--rollout-workers must be >= 1, got {self.rollout_workers}")
        if self.rollout_workers > 1 and self.ray is None:
            raise BebopError("--rollout-workers above 1 needs --ray (the workers are Ray actors)")
        if self.async_mode == "one-step" and self.total_threads() < 2:
            raise BebopError("--async-mode one-step needs --threads >= 2 (one for rollouts, one for training)")
        return self


def flag(name: str) -> str:
    return name.replace("_", "-")


def with_current_names(saved: dict) -> dict:
    """A run's config.json as read, with the fields renamed since under their names now."""
    return {RENAMED_FIELDS.get(k, k): v for k, v in saved.items()}
