"""`bebop train-draft`: train the draft (an MTP or EAGLE-3 head) before RL, on the target's own samples.

Read top to bottom (`train_draft`): check the settings against the target and the data -> resume a checkpoint of
the very same run, or build a fresh draft -> the target's features (one target forward per sequence, stored
on disk by bebop.training.features: the target is frozen, so its hidden states never change) -> steps: the
draft unrolled K depths on its own hidden states, exactly as at inference (bebop.training.targets), a loss
from bebop.training.losses, AdamW with warm-up and cosine decay, gradient clipping -> periodic held-out
evaluation (teacher-forced acceptance, and real speculative acceptance from the engine) -> checkpoints that
resume (bebop.io: one commit point each; a resume refuses other data or settings).

Depth k anchored at position t predicts token t + k + 1; its teacher distribution is the target's p at
position t + k, after the data's temperature. Only predictions of completion tokens are trained on.
With a reduced draft vocabulary (--draft-vocab N, the N most frequent tokens of the training data) q is zero
outside it, which is exactly the q rejection sampling will see at inference.
"""

import copy
import json
import math
import random
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from bebop.drafts.eagle3 import N_FEATURE_LAYERS, default_feature_layers
from bebop.drafts.base import Draft, target_signature
from bebop.drafts.registry import draft_from_state, load_draft, new_draft
from bebop.engine.generation import generate
from bebop.errors import BebopError
from bebop.io import load_checkpoint, save_checkpoint, truncate_log
from bebop.io import logged_step  # noqa: F401  (old name, kept for one release: now bebop.io.logged_step)
from bebop.models.registry import probed_choice
from bebop.sampling import SamplingParams
from bebop.training import losses
from bebop.training.data import data_identity, load_meta, load_split
from bebop.training.features import TargetFeatures
from bebop.training.losses import LOSSES, loss_at, loss_value
from bebop.training.config import TrainConfig, with_current_names
from bebop.training.targets import autocast, depth_tensors  # (old names here, kept for one release)


def frequent_tokens(rows: list[dict], n: int, always=()) -> torch.Tensor:
    counts = Counter(t for r in rows for t in r["completion_ids"])
    counts.update(t for r in rows for t in r["prompt_ids"])
    ids = set(always) | {t for t, _ in counts.most_common(n)}
    return torch.tensor(sorted(ids)[: max(n, len(always))], dtype=torch.long)


@torch.no_grad()
def teacher_forced_eval(mtp, feats: TargetFeatures, K, T, batch_size=8) -> dict:
    """Held-out acceptance if every earlier draft was accepted: mean alpha per depth and E[A] (cheap, exact),
    over all sequences and per task kind."""
    sums = {}  # kind -> [alpha sum per depth, count per depth, E[A] sum, anchors]
    for start in range(0, len(feats.seqs), batch_size):
        idx = list(range(start, min(start + batch_size, len(feats.seqs))))
        tokens, lens, plens, hidden, lse, captured = feats.get(idx)
        for kind in dict.fromkeys(feats.kinds[i] for i in idx):
            rows = torch.tensor([feats.kinds[i] == kind for i in idx], device=tokens.device)
            q_logits, p, _, mask = depth_tensors(mtp, tokens[rows], lens[rows], plens[rows], hidden[rows], lse[rows],
                                                 None if captured is None else captured[rows], K, T)
            alpha = losses.acceptance(p, q_logits.softmax(-1))
            for key in ("all", kind):
                acc = sums.setdefault(key, [torch.zeros(K), torch.zeros(K), 0.0, 0])
                acc[0] += torch.where(mask, alpha, 0).sum(0).cpu()
                acc[1] += mask.sum(0).cpu()
                acc[2] += float(losses.expected_accepted_length(alpha, mask).sum())
                acc[3] += len(alpha)
    stat = {k: ((a / c.clamp_min(1)).tolist(), ea / max(n, 1)) for k, (a, c, ea, n) in sums.items()}
    out = {"heldout_alpha": stat["all"][0], "heldout_expected_accepted": stat["all"][1]}
    out["heldout_alpha_by_kind"] = {k: v[0] for k, v in stat.items() if k != "all"}
    out["heldout_expected_accepted_by_kind"] = {k: v[1] for k, v in stat.items() if k != "all"}
    return out


def spec_eval(mtp, rows, K, T, n_prompts, max_new_tokens, seed=0) -> dict:
    """Real speculative acceptance from the engine on held-out prompts."""
    prompts = [r["prompt_ids"] for r in rows[:n_prompts]]
    g = generate(mtp.target, prompts, max_new_tokens, SamplingParams(T), mode="spec", draft=mtp, draft_len=K, seed=seed)
    s = g.stats
    return {"spec_acceptance_rate": s.acceptance_rate, "spec_mean_acceptance_length": s.mean_acceptance_length,
            "spec_per_position_acceptance": s.per_position_acceptance}


def paths(out):
    """OUT.safetensors + OUT.json (the finished MTP, loadable by `--mtp OUT`), OUT.ckpt/ (training checkpoints:
    weights, optimizer, RNG and data order, committed together) and OUT.metrics.jsonl."""
    out = Path(out)
    return out.with_suffix(".safetensors"), out.with_suffix(".json"), out.with_suffix(".ckpt"), \
        out.with_suffix(".metrics.jsonl")


def feature_store(data_dir, split: str, target, T: float, max_seq_len: int) -> Path:
    """Where train-draft keeps the target's features of a split (bebop.training.features): inside the data directory, so
    every run on that data (other losses, capacity options, resumes) shares them."""
    name = f"features-{split}-{target.name or 'model'}-T{T:g}-L{max_seq_len}".replace("/", "_")
    return Path(data_dir) / name


def has_checkpoint(out) -> bool:
    return load_checkpoint(paths(out)[2]) is not None


def check_settings(target, cfg: TrainConfig) -> tuple[int, ...]:
    """Refuse settings the target cannot take; returns the target layers a fresh draft reads."""
    if cfg.loss not in LOSSES:
        raise BebopError(f"unknown loss '{cfg.loss}' (choose from {', '.join(LOSSES)})")
    if cfg.max_seq_len > target.max_len:
        raise BebopError(f"--max-seq-len {cfg.max_seq_len} exceeds the context of '{target.name}' ({target.max_len})")
    n_layers = target.cfg.n_layers
    if any(not -n_layers <= i < n_layers for i in cfg.feature_layers):
        raise BebopError(f"--feature-layers {list(cfg.feature_layers)}: '{target.name}' has layers 0..{n_layers - 1}")
    if len({i % n_layers for i in cfg.feature_layers}) != len(cfg.feature_layers):
        raise BebopError(f"--feature-layers {list(cfg.feature_layers)}: a layer is given twice")
    feature_layers = tuple(i % n_layers for i in cfg.feature_layers)
    if cfg.kind not in ("mtp", "eagle3"):
        raise BebopError(f"unknown --kind '{cfg.kind}' (choose from mtp, eagle3)")
    if cfg.kind == "eagle3":
        if cfg.mtp_layers != 1:
            raise BebopError("--kind eagle3 has one decoder layer: --mtp-layers must be 1")
        feature_layers = feature_layers or tuple(default_feature_layers(n_layers))
        if len(feature_layers) != N_FEATURE_LAYERS:
            raise BebopError(f"--kind eagle3 reads {N_FEATURE_LAYERS} target layers, got --feature-layers "
                             f"{list(cfg.feature_layers)}")
        feature_layers = tuple(sorted(feature_layers))  # the engines concatenate them in layer order
    if cfg.mtp_layers > n_layers:
        raise BebopError(f"--mtp-layers {cfg.mtp_layers}: '{target.name}' has only {n_layers} layers to start from")
    return feature_layers


def load_rows(target, data_dir) -> tuple[list[dict], list[dict]]:
    """The data's train and held-out rows, refused if their token ids do not fit the target."""
    train_rows, heldout_rows = load_split(data_dir, "train"), load_split(data_dir, "heldout")
    vocab = target.cfg.vocab_size
    for r in train_rows + heldout_rows:
        if max(r["prompt_ids"] + r["completion_ids"] + [0]) >= vocab:
            raise BebopError(f"{data_dir}: token ids beyond the vocabulary of '{target.name}' (data of another model?)")
    return train_rows, heldout_rows


def resumable_checkpoint(out, ckpt_dir, identity: dict, resume: bool):
    """OUT's checkpoint when resuming (refused unless it was made by the very same run), None when starting;
    starting over an existing run is refused too, so nothing made earlier is overwritten silently."""
    ckpt = load_checkpoint(ckpt_dir)
    if resume and ckpt is None:
        raise BebopError(f"nothing to resume: no checkpoint in {ckpt_dir} (run without --resume to start)")
    if not resume and ckpt is not None:
        raise BebopError(f"{out} already holds a training run (checkpoint at step {ckpt.step} in {ckpt_dir}); "
                         f"pass --resume to continue it, or choose another --out")
    if ckpt is None:
        return None
    saved = dict(ckpt.meta.get("identity", {}))
    saved["config"] = with_current_names(saved.get("config", {}))
    changed = [k for k in identity if saved.get(k) != identity[k]]
    if "data" in changed:
        raise BebopError(f"cannot resume {out}: its checkpoint was trained on other data "
                         f"({ckpt.meta.get('data_path')}); the data must be byte-identical")
    if changed:
        if "config" in changed:
            diff = sorted(k for k in identity["config"] if saved["config"].get(k) != identity["config"][k])
            changed[changed.index("config")] = f"settings: {', '.join(diff)}"
        raise BebopError(f"cannot resume {out}: it differs from the checkpoint in {'; '.join(changed)}")
    return ckpt


def build_draft(target, cfg: TrainConfig, init: str | None, feature_layers: tuple[int, ...],
                train_rows: list[dict]) -> Draft:
    """A fresh draft: loaded from `init`, or new (seeded by cfg.seed), with its reduced vocabulary if asked."""
    if init:
        mtp = load_draft(init, target)
        if cfg.kind == "eagle3" and not cfg.feature_layers:  # an EAGLE-3 draft's own layers, by default
            feature_layers = tuple(mtp.feature_layers)
    elif cfg.kind == "eagle3":
        mtp = new_draft(target, "eagle3", seed=cfg.seed, feature_layers=feature_layers)
    else:
        mtp = new_draft(target, "mtp", seed=cfg.seed, layers=cfg.mtp_layers, feature_layers=feature_layers)
    if init and (mtp.arch, mtp.config.layers, tuple(mtp.feature_layers)) != (cfg.kind, cfg.mtp_layers, feature_layers):
        raise BebopError(f"--init {init} is an {mtp.arch} draft with "
                         f"{mtp.config.layers} layer(s) and feature layers {list(mtp.feature_layers) or 'none'}; "
                         f"pass the same --kind, --mtp-layers and --feature-layers")
    if cfg.draft_vocab:
        mtp.set_draft_vocab(frequent_tokens(train_rows, cfg.draft_vocab, always=target.eos_ids))
    return mtp


def lr_at(cfg: TrainConfig, warmup: int, step: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to min_lr_ratio * lr."""
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, cfg.steps - warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def target_features(target, mtp: Draft, cfg: TrainConfig, T: float, data_dir, train_rows, heldout_rows,
                    progress: bool) -> tuple[TargetFeatures, TargetFeatures, bool]:
    """The target's features of the train split and of the held-out sequences evaluated on, and whether bf16
    pays on this machine. "auto": bf16 where this machine's --dtype probe chose it for this model (cached per
    machine, so a resumed or parallel run decides alike and reuses the same feature store)."""
    name = target.name
    choice = probed_choice(target, name) if "auto" in (cfg.features_dtype, cfg.autocast) else None
    bf16_pays = choice is not None and choice["dtype"] == "bfloat16"
    compute_model = None  # the features' forward: a bf16 copy of the target where that is faster
    if cfg.features_dtype == "bfloat16" or (cfg.features_dtype == "auto" and bf16_pays):
        compute_model = copy.deepcopy(target).to(torch.bfloat16)

    def features(rows, split):
        return TargetFeatures(target, rows, T, cfg.max_seq_len, mtp.feature_layers,
                              feature_store(data_dir, split, target, T, cfg.max_seq_len), progress=progress,
                              compute_model=compute_model)

    return features(train_rows, "train"), features(heldout_rows[:cfg.eval_sequences],
                                                   f"heldout{cfg.eval_sequences}"), bf16_pays


@dataclass
class Run:
    """One training run's state: what a step changes and a checkpoint stores, and what every row records."""
    mtp: Draft
    opt: torch.optim.Optimizer
    rng: random.Random
    order: list[int]  # the rest of the current epoch's shuffled sequence indices
    use_bf16: bool
    warmup: int
    identity: dict  # what a resume must match
    provenance: dict  # what the saved draft records about its training
    params: list = field(default_factory=list)


def train_step(run: Run, cfg: TrainConfig, train_feats: TargetFeatures, n_rows: int, T: float, step: int,
               started: float) -> dict:
    """One optimizer step on the next batch of the shuffled epoch; returns its metrics row."""
    if len(run.order) < cfg.batch_size:  # epochs of shuffled sequences
        run.order += run.rng.sample(range(n_rows), n_rows)
    idx, run.order = run.order[:cfg.batch_size], run.order[cfg.batch_size:]
    name = loss_at(cfg.loss, step, cfg.steps)
    with autocast(run.mtp.target, run.use_bf16):
        q_logits, p, labels, mask = depth_tensors(run.mtp, *train_feats.get(idx), cfg.draft_len, T)
        loss = loss_value(name, q_logits.float(), p.float(), labels, mask)
    for g in run.opt.param_groups:
        g["lr"] = lr_at(cfg, run.warmup, step)
    run.opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip)
    run.opt.step()
    with torch.no_grad():
        alpha = losses.acceptance(p.float(), q_logits.float().softmax(-1))
        train_alpha = torch.where(mask, alpha, 0).sum(0) / mask.sum(0).clamp_min(1)
    return {"step": step + 1, "loss": loss.item(), "loss_fn": name, "bf16": run.use_bf16,
            "lr": lr_at(cfg, run.warmup, step), "grad_norm": float(grad_norm), "train_alpha": train_alpha.tolist(),
            "seconds": time.time() - started}


def evaluate(mtp: Draft, cfg: TrainConfig, eval_feats: TargetFeatures, heldout_rows, T: float, step: int) -> dict:
    """Held-out teacher-forced acceptance and, with eval prompts, the engine's real speculative acceptance."""
    mtp.eval()
    row = {"step": step, **teacher_forced_eval(mtp, eval_feats, cfg.draft_len, T)}
    if cfg.eval_prompts:
        row.update(spec_eval(mtp, heldout_rows, cfg.draft_len, T, cfg.eval_prompts, cfg.eval_new_tokens))
    mtp.train()
    return row


def save(run: Run, out, ckpt_dir, data_dir, step: int) -> None:
    """Commit a checkpoint (weights, optimizer, RNG and data order together), then the user-facing draft."""
    mtp = run.mtp
    state = {"optimizer": run.opt.state_dict(), "rng": run.rng.getstate(), "order": run.order,
             "use_bf16": run.use_bf16}
    mtp_config = asdict(mtp.config) | {"meta": {**mtp.config.meta, **run.provenance, "step": step}}
    save_checkpoint(ckpt_dir, step, mtp.state_dict(), state, {"identity": run.identity, "mtp_config": mtp_config,
                                                              "data_path": str(Path(data_dir).resolve())})
    mtp.save(out, **run.provenance, step=step)  # the user-facing copy; resumes read the checkpoint above


def start_run(target, data_dir, out, cfg: TrainConfig, init: str | None, resume: bool, command: str | None,
              progress: bool):
    """Check the settings, resume the checkpoint or build a fresh draft, its optimizer and the features.
    Returns the run, its first step, the train and eval features and the held-out rows."""
    feature_layers = check_settings(target, cfg)
    T = cfg.temperature or load_meta(data_dir).get("temperature") or 1.0
    train_rows, heldout_rows = load_rows(target, data_dir)
    _, _, ckpt_dir, metrics_path = paths(out)
    identity = {"config": asdict(cfg), "data": data_identity(data_dir), "init": init,
                "target": target_signature(target)}
    identity = json.loads(json.dumps(identity))  # as the checkpoint stores it (tuples become lists)
    ckpt = resumable_checkpoint(out, ckpt_dir, identity, resume)
    if ckpt is not None:
        mtp = draft_from_state(target, ckpt.tensors, ckpt.meta["mtp_config"], str(ckpt.path))
        state, start_step = ckpt.state, ckpt.step
    else:
        mtp = build_draft(target, cfg, init, feature_layers, train_rows)
        state, start_step = None, 0
        metrics_path.unlink(missing_ok=True)
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    mtp.train()
    params = [p for p in mtp.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    rng, order = random.Random(cfg.seed), []
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        rng.setstate(state["rng"])
        order = state["order"]
        truncate_log(metrics_path, start_step)  # rows logged after the checkpoint (and a torn last line): redone
    train_feats, eval_feats, bf16_pays = target_features(target, mtp, cfg, T, data_dir, train_rows, heldout_rows,
                                                         progress)
    if state is not None and "use_bf16" in state:  # a resumed run keeps its numerics
        use_bf16 = state["use_bf16"]
    else:
        use_bf16 = cfg.autocast == "bf16" or (cfg.autocast == "auto" and bf16_pays)
    provenance = {"loss": cfg.loss, "draft_len": cfg.draft_len, "data": str(data_dir), "temperature": T,
                  "train_sequences": len(train_rows), "config": asdict(cfg), "command": command,
                  "init": init, "name": Path(out).name}
    run = Run(mtp, opt, rng, order, use_bf16, cfg.warmup or max(1, cfg.steps // 20), identity, provenance, params)
    return run, start_step, T, train_feats, eval_feats, heldout_rows, len(train_rows)


def train_draft(target, data_dir, out, cfg: TrainConfig, init: str | None = None, resume: bool = False,
                progress: bool = True, command: str | None = None) -> Draft:
    """Train a draft for `target` on a make-data directory. `resume`: continue OUT's last checkpoint (an error
    if there is none, or if it was made with other data, settings, model or init); without it, an existing
    checkpoint at OUT is an error too, so nothing made earlier is overwritten silently."""
    run, start_step, T, train_feats, eval_feats, heldout_rows, n_rows = start_run(
        target, data_dir, out, cfg, init, resume, command, progress)
    _, _, ckpt_dir, metrics_path = paths(out)
    log = open(metrics_path, "a")
    bar = tqdm(total=cfg.steps, initial=start_step, desc=f"train-draft {cfg.loss}", disable=not progress)
    started = time.time()
    for step in range(start_step, cfg.steps):
        row = train_step(run, cfg, train_feats, n_rows, T, step, started)
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            row.update(evaluate(run.mtp, cfg, eval_feats, heldout_rows, T, step + 1))
            bar.set_postfix(alpha1=f"{row['heldout_alpha'][0]:.3f}", EA=f"{row['heldout_expected_accepted']:.2f}")
        log.write(json.dumps(row) + "\n")
        log.flush()
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save(run, out, ckpt_dir, data_dir, step + 1)
        bar.update(1)
    bar.close()
    log.close()
    if start_step == cfg.steps:  # resumed a finished run: its user-facing copy may predate the last checkpoint
        run.mtp.save(out, **run.provenance, step=cfg.steps)
    return run.mtp.eval()


def train_mtp(*args, **kwargs) -> Draft:
    """The old name of train_draft, for one release."""
    warnings.warn("bebop.train_mtp is now bebop.train_draft; the old name goes in the next release",
                  DeprecationWarning, stacklevel=2)
    return train_draft(*args, **kwargs)
