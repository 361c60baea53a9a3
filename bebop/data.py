"""`bebop make-data`: the target's own rollouts at the RL temperature (self-distillation data for the MTP).

A data directory holds `train.jsonl` and `heldout.jsonl` (one sequence per line: kind, prompt, prompt_ids,
completion_ids) and `meta.json` (model and generation settings). Prompts come from the built-in tasks
(bebop.tasks: chat, math and code; held-out prompts never appear in the train split) or from a JSONL file
(then the last tenth of its prompts is held out). Generation appends batch by batch, so an interrupted run
resumes where it stopped.
"""

import json
from pathlib import Path

from tqdm import tqdm

from bebop.engine import generate
from bebop.errors import BebopError
from bebop.models.registry import chat_ids
from bebop.sampling import SamplingParams
from bebop.tasks import load_prompts_file, mixed_tasks

SPLITS = ("train", "heldout")


def prompt_split(source: str, n: int, split: str, seed: int) -> list[tuple[str, str]]:
    """(kind, prompt) pairs: `n` for the split, from 'builtin' tasks or a prompts file."""
    if source == "builtin":
        return [(t.kind, t.prompt) for t in mixed_tasks(n, seed=seed, split=split)]
    prompts = load_prompts_file(source)
    if len(prompts) < 2:
        raise BebopError(f"{source}: needs at least 2 prompts to hold one out")
    cut = max(1, len(prompts) // 10)
    pool = prompts[:-cut] if split == "train" else prompts[-cut:]
    return [("file", pool[i % len(pool)]) for i in range(n)]


def make_data(model, tokenizer, out_dir, source="builtin", num_samples=512, heldout_samples=64,
              params=SamplingParams(1.0), max_new_tokens=128, batch_size=16, seed=0, model_name=None):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": model_name, "source": source, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "max_new_tokens": max_new_tokens, "seed": seed,
            "num_samples": {"train": num_samples, "heldout": heldout_samples}}
    meta_path = out / "meta.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if {k: v for k, v in old.items() if k != "num_samples"} != {k: v for k, v in meta.items() if k != "num_samples"}:
            raise BebopError(f"{out} holds data made with other settings ({meta_path}); use a new --out")
    meta_path.write_text(json.dumps(meta, indent=1))
    for split, n in (("train", num_samples), ("heldout", heldout_samples)):
        path = out / f"{split}.jsonl"
        done = sum(1 for _ in open(path)) if path.exists() else 0
        todo = prompt_split(source, n, split, seed)[done:]
        with open(path, "a") as f, tqdm(total=n, initial=done, desc=f"make-data {split}", unit="seq") as bar:
            for start in range(0, len(todo), batch_size):
                batch = todo[start:start + batch_size]
                ids = [chat_ids(tokenizer, p) for _, p in batch]
                g = generate(model, ids, max_new_tokens, params, mode="ar", seed=seed * 7919 + done + start)
                for (kind, prompt), p_ids, r in zip(batch, ids, g.rollouts):
                    f.write(json.dumps({"kind": kind, "prompt": prompt, "prompt_ids": p_ids,
                                        "completion_ids": r.tokens}) + "\n")
                f.flush()
                bar.update(len(batch))
    return out


def load_split(data_dir, split: str) -> list[dict]:
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.exists():
        raise BebopError(f"{data_dir}: no {split}.jsonl (make it with `bebop make-data`)")
    rows = []
    for lineno, line in enumerate(open(path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            assert isinstance(row["prompt_ids"], list) and isinstance(row["completion_ids"], list)
        except (json.JSONDecodeError, KeyError, TypeError, AssertionError):
            raise BebopError(f"{path}:{lineno}: not a make-data record (needs prompt_ids and completion_ids)") from None
        rows.append(row)
    if not rows:
        raise BebopError(f"{path}: empty")
    return rows


def load_meta(data_dir) -> dict:
    path = Path(data_dir) / "meta.json"
    if not path.exists():
        raise BebopError(f"{data_dir}: not a data directory of `bebop make-data` (no meta.json)")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BebopError(f"{data_dir}: cannot read meta.json ({e})") from None
