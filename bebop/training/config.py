"""`bebop train-draft`'s settings, with their defaults in one place (the command line reads them from here). No
torch: the parser imports it to build --help."""

from dataclasses import dataclass


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
    arch: str = "mtp"  # the draft kind: "mtp" (DeepSeek-V3 layout) or "eagle3" (what vLLM and SGLang load)
    mtp_layers: int = 1  # decoder blocks of a fresh MTP (DeepSeek-V3: 1)
    feature_layers: tuple[int, ...] = ()  # target layers a fresh MTP reads (EAGLE-3); () = the last hidden state
    # machine-dependent speed-ups, as the CLI sets them: the features' forward in float32, bfloat16 or auto, and
    # bf16 autocast of the training steps over fp32 weights: off, bf16 or auto; auto = bf16 where this machine's
    # cached --dtype probe chose bf16 for the model (float32 / off where it did not, or never probed it)
    features_dtype: str = "auto"
    autocast: str = "auto"
