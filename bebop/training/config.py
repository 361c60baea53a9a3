"""`bebop train-draft`'s settings, with their defaults in one place (the command line reads them from here). No
torch: the parser imports it to build --help."""

import warnings
from dataclasses import InitVar, dataclass

RENAMED_FIELDS = {"arch": "kind"}  # old name -> name now, for configs saved before the rename


@dataclass
class TrainConfig:
    loss: str = "e2e-tv"
    draft_len: int = 3
    steps: int = 500
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 0  # 0 = 5% of the steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_seq_len: int = 384
    draft_vocab: int = 0  # 0 = the target's full vocabulary
    temperature: float = 0.0  # 0 = the data's temperature
    eval_every: int = 100
    eval_sequences: int = 64  # held-out sequences for teacher-forced acceptance
    eval_prompts: int = 8  # held-out prompts for real speculative acceptance
    eval_new_tokens: int = 48
    save_every: int = 100
    seed: int = 0
    kind: str = "mtp"  # the draft kind: "mtp" (DeepSeek-V3 layout) or "eagle3" (what vLLM and SGLang load)
    mtp_layers: int = 1  # decoder blocks of a fresh MTP (DeepSeek-V3: 1)
    feature_layers: tuple[int, ...] = ()  # target layers a fresh MTP reads (EAGLE-3); () = the last hidden state
    # machine-dependent speed-ups, as the CLI sets them: the features' forward in float32, bfloat16 or auto, and
    # bf16 autocast of the training steps over fp32 weights: off, bf16 or auto; auto = bf16 where this machine's
    # cached --dtype probe chose bf16 for the model (float32 / off where it did not, or never probed it)
    features_dtype: str = "auto"
    autocast: str = "auto"
    arch: InitVar[str | None] = None  # the old name of `kind`, accepted for one release with a DeprecationWarning

    def __post_init__(self, arch):
        if arch is not None:
            warnings.warn("TrainConfig(arch=...) is now TrainConfig(kind=...); arch= goes in the next release",
                          DeprecationWarning, stacklevel=3)
            self.kind = arch


def with_current_names(saved: dict) -> dict:
    """A saved TrainConfig (a checkpoint's identity) with the fields renamed since under their names now."""
    return {RENAMED_FIELDS.get(k, k): v for k, v in saved.items()}
