"""Training checkpoints with one commit point, so that a crash at any instant leaves the previous complete
checkpoint or the new one, never a mix.

A checkpoint root is a directory of committed checkpoints `step-000000012/`, each holding
    tensors.safetensors   weights (exact bits)
    state.pt              everything else a resume needs: optimizer, RNG and data-order state (torch.save)
    meta.json             {"step": N, ...the caller's meta: config, data identity, provenance}
Everything is written into a fresh `.tmp-*` directory inside the root, flushed to disk, and then renamed to
its `step-*` name: the rename is the commit point (atomic on POSIX). Readers only ever look at `step-*`
directories, so a half-written checkpoint is invisible; stale `.tmp-*` directories (a writer that died) are
removed by the next save. Older checkpoints are pruned after the commit, keeping the newest `keep`.

    save_checkpoint(root, step, tensors, state, meta, keep=1) -> Path
    load_checkpoint(root) -> Checkpoint(step, tensors, state, meta, path) | None   (None: nothing committed)
Single files (caches, metadata, metrics) get the same guarantee from `write_text_atomic`, and a resumed run's
JSONL logs drop, in one such write, the rows logged after its checkpoint (`truncate_log`).
"""

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bebop.errors import BebopError

PREFIX = "step-"


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and one rename: a reader, or a crash, sees the old file
    or the new one, never half of one. The temporary name carries the process id, so that concurrent writers
    (two runs probing the same cache) never write into each other's temporary file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing behind
        raise


def logged_step(line: str) -> int:
    """The "step" of a JSONL log line; a line torn by a crash counts as after every checkpoint."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return 1 << 62


def truncate_log(path, step: int) -> None:
    """Keep the lines of the JSONL log at `path` logged at or before `step` (the rest are redone after a resume),
    in one atomic write; a missing log stays missing."""
    path = Path(path)
    if path.exists():
        rows = [r for r in path.read_text().splitlines() if logged_step(r) <= step]
        write_text_atomic(path, "".join(r + "\n" for r in rows))


@dataclass
class Checkpoint:
    step: int
    tensors: dict
    state: dict
    meta: dict
    path: Path


def fsync(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def committed(root) -> list[Path]:
    """The committed checkpoint directories under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir()),
                  key=lambda p: int(p.name[len(PREFIX):]))


def save_checkpoint(root, step: int, tensors: dict, state: dict | None = None, meta: dict | None = None,
                    keep: int = 1) -> Path:
    """Commit one checkpoint for `step` under `root` (created if missing) and prune older ones."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # a previous writer died before its commit: never visible, drop it
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(tmp / "tensors.safetensors"))
        torch.save(state or {}, tmp / "state.pt")
        (tmp / "meta.json").write_text(json.dumps({**(meta or {}), "step": step}, indent=1))
        for f in tmp.iterdir():  # the data must be on disk before the rename that publishes it
            fsync(f)
        fsync(tmp)
    except (OSError, RuntimeError, SafetensorError) as e:  # a full disk fails in each writer's own way
        shutil.rmtree(tmp, ignore_errors=True)  # the last committed checkpoint stays as it was
        raise BebopError(f"cannot write a checkpoint under {root}: {e}") from None
    final = root / f"{PREFIX}{step:09d}"
    if final.exists():  # the same step saved again (a rerun): move the old one aside first, rename needs room
        old = Path(tempfile.mkdtemp(prefix=".tmp-old-", dir=root))
        final.rename(old / final.name)
    tmp.rename(final)  # the commit point
    fsync(root)
    for old in committed(root)[:-keep] + list(root.glob(".tmp-old-*")):
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(root) -> Checkpoint | None:
    """The newest committed checkpoint under `root`, or None if there is none."""
    done = committed(root)
    if not done:
        return None
    path = done[-1]
    try:
        meta = json.loads((path / "meta.json").read_text())
        tensors = load_file(str(path / "tensors.safetensors"))
        state = torch.load(path / "state.pt", weights_only=False)
    except Exception as e:  # committed but unreadable: disk damage or a foreign directory; say which
        raise BebopError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e})") from None
    return Checkpoint(int(meta["step"]), tensors, state, meta, path)
