"""SIGKILL a tiny `bebop rl --save-every 1` run at random steps, `--resume` after each kill, and check that the final
checkpoint equals an uninterrupted run's bit for bit (policy, online-trained MTP, or the history draft's state with
DRAFT `history`) with one metrics row per step. A fixed --draft-len: with auto, K follows measured step times, so
no two runs draw the same samples.

    OMP_NUM_THREADS=1 python examples/kill_resume_rl.py [SEED] [KILLS] [DRAFT: online-kl (default) or history]

A kill lands a random 0-0.4 s after the checkpoint of a random step appears (during the next step's rollout,
training or the checkpoint write itself); a kill that lands while a resumed run is still loading is harmless too.
"""

import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file

STEPS = 16
ARGS = ["rl", "--model", "tiny-llama", "--task", "arithmetic", "--steps", str(STEPS), "--prompts-per-step", "2",
        "--num-generations", "2", "--max-completion-length", "8", "--rollout", "spec", "--draft-len", "3",
        "--draft-strategy", "online-kl",  # (or, with DRAFT history: --draft history over 2 prompts in turn)
        "--async-mode", "off", "--threads", "1", "--autocast", "off",  # rollout dtype: auto (fp32 here), kept on resume
        "--eval-prompts", "2", "--save-every", "1", "--seed", "0"]
BEBOP = [sys.executable, "-m", "bebop.cli"]


def steps_saved(out):
    return [int(p.rsplit("-", 1)[1]) for p in glob.glob(f"{out}/ckpt/step-*")]


def run(out, resume=False, kill_at=None):
    """Run to the end (returns its exit code) or SIGKILL it `kill_at` = (step, delay) (returns 'killed')."""
    p = subprocess.Popen([*BEBOP, *ARGS, "--out", out] + (["--resume"] if resume else []),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kill_at is not None:
        step, delay = kill_at
        while p.poll() is None and max(steps_saved(out), default=0) < step:
            time.sleep(0.01)
        time.sleep(delay)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
            return "killed", b""
    _, err = p.communicate()
    return p.returncode, err


def final(out):
    last = max(steps_saved(out))
    path = f"{out}/ckpt/step-{last:09d}"
    return last, load_file(f"{path}/tensors.safetensors"), torch.load(f"{path}/state.pt", weights_only=False)["history"]


def main():
    seed, kills = (int(a) for a in (sys.argv[1:] + ["0", "5"])[:2])
    if sys.argv[3:4] == ["history"]:
        i = ARGS.index("--draft-strategy")
        ARGS[i:i + 2] = ["--draft", "history", "--num-train-prompts", "2"]
    rng = random.Random(seed)
    root = tempfile.mkdtemp(prefix="kill-resume-rl-")
    rc, err = run(f"{root}/full")
    assert rc == 0, err.decode()[-500:]
    done = 0
    while True:
        resume = bool(steps_saved(f"{root}/part"))
        rc, err = run(f"{root}/part", resume, (rng.randint(1, STEPS - 1), rng.uniform(0, 0.4)) if done < kills else None)
        if rc == "killed":
            done += 1
            print(f"kill {done}: checkpoints {sorted(steps_saved(f'{root}/part'))}", flush=True)
            continue
        assert rc == 0, err.decode()[-500:]
        break
    (sa, a, ha), (sb, b, hb) = final(f"{root}/full"), final(f"{root}/part")
    same = sa == sb and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) and ha == hb
    if ha is not None:
        print(f"history draft state saved: {len(str(ha))} characters, identical: {ha == hb}")
    steps = [json.loads(line)["step"] for line in open(f"{root}/part/metrics.jsonl")]
    print(f"{done} kills; final step {sa} vs {sb}; identical: {same}; metrics steps {steps}")
    shutil.rmtree(root)
    sys.exit(0 if same and steps == list(range(1, STEPS + 1)) else 1)


if __name__ == "__main__":
    main()
