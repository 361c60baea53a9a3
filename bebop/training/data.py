"""`bebop make-data`: the target's own rollouts at the RL temperature (self-distillation data for the MTP).

A data directory holds `train.jsonl` and `heldout.jsonl` (one sequence per line: kind, prompt, prompt_ids,
completion_ids) and `meta.json` (model and generation settings). Prompts come from the built-in tasks
(bebop.tasks: chat, math and code mixed by `--mix`; held-out prompts never appear in the train split) or from a JSONL file
(then the last tenth of its prompts is held out). Generation appends batch by batch, so an interrupted run
resumes where it stopped (a line torn by the interruption is dropped and redone). A rerun into an existing
directory must use the same settings and at least as many samples as it holds: data is never silently dropped.
"""

import hashlib
import json
from pathlib import Path

from tqdm import tqdm

from bebop.io import write_text_atomic
from bebop.engine.generation import generate
from bebop.errors import BebopError
from bebop.models.registry import chat_ids
from bebop.sampling import SamplingParams
from bebop.tasks import load_prompts_file, mixed_tasks

SPLITS = ("train", "heldout")


# the default mixture of built-in kinds: mostly the math and code that RL trains on, plus chat for general text
DEFAULT_MIX = {"math": 0.4, "code": 0.3, "chat": 0.3}


def prompt_split(source: str, n: int, split: str, seed: int, mix=None) -> list[tuple[str, str]]:
    """(kind, prompt) pairs: `n` for the split, from 'builtin' tasks (in the proportions of `mix`) or a
    prompts file."""
    if source == "builtin":
        return [(t.kind, t.prompt) for t in mixed_tasks(n, seed=seed, split=split, mix=mix or DEFAULT_MIX)]
    prompts = load_prompts_file(source)
    if len(prompts) < 2:
        raise BebopError(f"{source}: needs at least 2 prompts to hold one out")
    cut = max(1, len(prompts) // 10)
    pool = prompts[:-cut] if split == "train" else prompts[-cut:]
    return [("file", pool[i % len(pool)]) for i in range(n)]


def make_data(model, tokenizer, out_dir, source="builtin", num_samples=512, heldout_samples=64,
              params=SamplingParams(1.0), max_new_tokens=128, batch_size=16, seed=0, model_name=None, mix=None):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mix = (mix or DEFAULT_MIX) if source == "builtin" else None
    dtype = str(model.embed.weight.dtype).removeprefix("torch.")  # the samples' numerics: part of what they are
    meta = {"model": model_name, "source": source, "mix": mix, "dtype": dtype, "temperature": params.temperature,
            "top_p": params.top_p, "top_k": params.top_k, "max_new_tokens": max_new_tokens, "seed": seed,
            "num_samples": {"train": num_samples, "heldout": heldout_samples}}
    meta_path = out / "meta.json"
    if meta_path.exists():
        old = load_meta(out)
        differ = sorted(k for k in (set(old) | set(meta)) - {"num_samples"} if old.get(k) != meta.get(k))
        if differ:
            raise BebopError(f"{out} holds data made with other settings ({', '.join(differ)}: see {meta_path}); "
                             f"use a new --out")
    splits = {"train": num_samples, "heldout": heldout_samples}
    done = {split: complete_lines(out / f"{split}.jsonl") for split in SPLITS}
    for split in SPLITS:
        if done[split] > splits[split]:
            raise BebopError(f"{out} already holds {done[split]} {split} sequences, more than the {splits[split]} "
                             f"asked for; ask for at least {done[split]} or use a new --out")
    # the prompts of every split, tokenized and checked against the context before any generation
    todo = {split: prompt_split(source, n, split, seed, mix)[done[split]:] for split, n in splits.items()}
    ids = {split: [chat_ids(tokenizer, p) for _, p in todo[split]] for split in SPLITS}
    longest = max((len(i) for split in SPLITS for i in ids[split]), default=0)
    if longest + max_new_tokens > model.max_len:
        raise BebopError(f"a prompt of {longest} tokens + --max-new-tokens {max_new_tokens} exceeds the context of "
                         f"'{model_name}' ({model.max_len} tokens)")
    write_text_atomic(meta_path, json.dumps(meta, indent=1))
    for split, n in splits.items():
        path = out / f"{split}.jsonl"
        with open(path, "a") as f, tqdm(total=n, initial=done[split], desc=f"make-data {split}", unit="seq") as bar:
            for start in range(0, len(todo[split]), batch_size):
                batch, batch_ids = todo[split][start:start + batch_size], ids[split][start:start + batch_size]
                first = done[split] + start  # one seed per sequence index: a resumed run draws what a whole one would
                g = generate(model, batch_ids, max_new_tokens, params, mode="ar",
                             seed=[(seed << 32) + first + b for b in range(len(batch))])
                for (kind, prompt), p_ids, r in zip(batch, batch_ids, g.rollouts):
                    f.write(json.dumps({"kind": kind, "prompt": prompt, "prompt_ids": p_ids,
                                        "completion_ids": r.tokens}) + "\n")
                f.flush()
                bar.update(len(batch))
    return out


def complete_lines(path: Path) -> int:
    """Lines of a split file that were written whole; a trailing torn line (a crash mid-write) is cut off."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        with open(path, "r+b") as f:
            f.truncate(len(whole))
    return whole.count(b"\n")


def data_identity(data_dir) -> dict:
    """What a training run was made from: its meta.json and a hash of each file (a resumed run must see
    byte-identical data; the same data moved elsewhere is still the same data)."""
    data_dir = Path(data_dir)
    files = {}
    for name in ("meta.json", *(f"{s}.jsonl" for s in SPLITS)):
        h = hashlib.sha256()
        with open(data_dir / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        files[name] = h.hexdigest()
    return {"meta": load_meta(data_dir), "sha256": files}


def load_split(data_dir, split: str) -> list[dict]:
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.exists():
        raise BebopError(f"{data_dir}: no {split}.jsonl (make it with `bebop make-data`)")
    rows = []
    with open(path) as f:
        lines = f.readlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ids = row["prompt_ids"] + row["completion_ids"]
            ok = isinstance(ids, list) and all(type(t) is int and t >= 0 for t in ids)
        except (json.JSONDecodeError, KeyError, TypeError):
            ok = False
        if not ok:  # an explicit check, not an assert: `python -O` would skip that
            raise BebopError(f"{path}:{lineno}: not a make-data record (needs prompt_ids and completion_ids: lists of token ids)")
        rows.append(row)
    if not rows:
        raise BebopError(f"{path}: empty")
    return rows


def load_meta(data_dir) -> dict:
    path = Path(data_dir) / "meta.json"
    if not path.exists():
        raise BebopError(f"{data_dir}: not a data directory of `bebop make-data` (no meta.json)")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BebopError(f"{data_dir}: cannot read meta.json ({e})") from None
    if not isinstance(meta, dict):
        raise BebopError(f"{data_dir}: meta.json is not a JSON object")
    return meta
