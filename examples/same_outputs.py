"""Record what a fixed set of bebop commands write, or check that the code still writes exactly that.

A refactor must not change behaviour: for fixed seeds and a fixed draft length, `bebop generate` (ar, spec,
spec-greedy at T=0 and T=1, with both shipped drafts), `make-data` + `train-draft` (20 steps) and `rl` (3 steps,
synchronous) must write the same bytes before and after. Timings, paths and random save ids are the only fields
left out of the comparison; every token, log-probability, loss, reward and weight is compared exactly.

    python examples/same_outputs.py record runs/same-outputs/before.json
    python examples/same_outputs.py check runs/same-outputs/before.json

The model is smollm2-135m with the machine's probed dtype (the probe's answer is cached per machine, so both runs
use the same kernels); the training steps run with autocast off and fp32 features, which no timing decides.
"""

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.numpy import load_file

WORK = Path("runs/same-outputs/work")
SHIPPED = Path(__file__).resolve().parent.parent / "bebop" / "checkpoints"
GEN = ["--model", "smollm2-135m", "--prompt", "Write a haiku about the sea.", "--num-samples", "3",
       "--max-new-tokens", "24", "--draft-len", "3", "--seed", "7"]
COMMANDS = {
    **{f"generate-{mode}-T{t}-{draft}": ["generate", *GEN, "--mode", mode, "--temperature", str(t),
                                          "--draft", str(SHIPPED / f"smollm2-135m-{draft}"),
                                          "--output", str(WORK / f"generate-{mode}-T{t}-{draft}.jsonl")]
       for draft in ("mtp", "eagle3") for mode in ("ar", "spec", "spec-greedy") for t in (0, 1)},
    "make-data": ["make-data", "--model", "smollm2-135m", "--num-samples", "8", "--heldout-samples", "4",
                  "--max-new-tokens", "32", "--draft-len", "3", "--seed", "1", "--out", str(WORK / "data")],
    "train-draft": ["train-draft", "--model", "smollm2-135m", "--data", str(WORK / "data"), "--steps", "20",
                  "--batch-size", "4", "--eval-every", "10", "--save-every", "10", "--eval-prompts", "2",
                  "--eval-sequences", "4", "--autocast", "off", "--features-dtype", "float32", "--seed", "0",
                  "--out", str(WORK / "draft")],
    "rl": ["rl", "--model", "smollm2-135m", "--task", "arithmetic", "--steps", "3", "--prompts-per-step", "2",
           "--num-generations", "2", "--max-completion-length", "16", "--rollout", "spec", "--draft-len", "3",
           "--async-mode", "off", "--autocast", "off", "--threads", "2", "--eval-prompts", "2", "--seed", "0",
           "--out", str(WORK / "rl")],
}
# a key holding a duration, a rate, a clock reading, where the run happened (its directory, its machine) or a
# save's random id: not behaviour
TIMING = re.compile(r"(^|_)(s|ms|time|seconds|secs|wall|elapsed|per_s|tok_s|tokens_per_s|date|started|finished|"
                    r"host|pid|cpu|machine|command|speed|throughput|path|save_id)($|_)|_s$|_ms$|tok/s")


def scrub(value):
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in sorted(value.items()) if not TIMING.search(k)}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def tensor_bytes(value):
    if isinstance(value, torch.Tensor):
        return hashlib.sha256(value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
    if isinstance(value, dict):
        return {str(k): tensor_bytes(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
                if not TIMING.search(str(k))}
    if isinstance(value, (list, tuple)):
        return [tensor_bytes(v) for v in value]
    return value


def digest(path: Path) -> str:
    h = hashlib.sha256()
    if path.suffix == ".safetensors":
        for name, array in sorted(load_file(path).items()):
            h.update(name.encode() + str(array.dtype).encode() + str(array.shape).encode() + array.tobytes())
    elif path.suffix == ".json":
        h.update(json.dumps(scrub(json.loads(path.read_text())), sort_keys=True).encode())
    elif path.suffix == ".jsonl":
        for line in path.read_text().splitlines():
            if line.strip():
                h.update(json.dumps(scrub(json.loads(line)), sort_keys=True).encode())
    elif path.suffix == ".pt":  # optimizer state: every tensor and number in it, not the pickle's bytes
        h.update(repr(tensor_bytes(torch.load(path, weights_only=False))).encode())
    elif path.suffix in (".npy", ".bin", ".txt", ".csv", ".md"):
        h.update(path.read_bytes())
    else:
        return "(not compared)"
    return h.hexdigest()


def run_all() -> dict:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    for name, args in COMMANDS.items():
        print(f"[same-outputs] bebop {' '.join(args)}", file=sys.stderr, flush=True)
        subprocess.run(["bebop", *args], check=True, stdout=subprocess.DEVNULL)
    return digest_all()


def digest_all() -> dict:
    return {str(p.relative_to(WORK)): digest(p) for p in sorted(WORK.rglob("*")) if p.is_file()}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("record", "check"):
        sys.exit(__doc__)
    verb, manifest = sys.argv[1], Path(sys.argv[2])
    found = run_all()
    if verb == "record":
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps(found, indent=1) + "\n")
        print(f"recorded {len(found)} files in {manifest}")
        return
    want = json.loads(manifest.read_text())
    differ = sorted(k for k in want.keys() | found.keys() if want.get(k) != found.get(k))
    for k in differ:
        print(f"DIFFERS {k}: {want.get(k, '(missing)')[:12]} -> {found.get(k, '(missing)')[:12]}")
    print(f"{len(want) - len(differ)} of {len(want)} files the same" + ("" if differ else ": identical"))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
