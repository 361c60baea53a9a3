"""Finding 3 on the RL task's own data: the pre-RL drafts of examples/finding4_runs.sh, one set per time the
study's data was made (each machine makes its own), compared by loss on held-out teacher-forced acceptance.
Within a set every loss trained from the same init on the same data with the same seed, so the losses are
compared by their paired differences across sets (a t interval over sets).

    python examples/finding4_drafts.py [--dir results/rl-finding4-smollm2-135m/drafts] [--out .../replicates.md]

A set is the drafts that share a suffix: draft-<loss><suffix>.metrics.jsonl ("" for the study's first).
"""

import argparse
import json
import re
from pathlib import Path

import numpy as np
from scipy import stats

LOSSES = ("kl+e2e-tv", "kl", "ce")  # the first is compared with each of the others


def heldout_alpha(path: Path) -> list[float]:
    """The held-out acceptance per depth at the draft's last evaluation."""
    rows = [json.loads(line) for line in path.open() if '"heldout_alpha"' in line]
    return rows[-1]["heldout_alpha"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="results/rl-finding4-smollm2-135m/drafts")
    ap.add_argument("--out", default=None, help="also write the tables here (markdown)")
    args = ap.parse_args()
    sets: dict[str, dict[str, list[float]]] = {}
    for path in sorted(Path(args.dir).glob("draft-*.metrics.jsonl")):
        loss, suffix = next(((loss, path.name[len(f"draft-{loss}"):-len(".metrics.jsonl")]) for loss in LOSSES
                             if re.fullmatch(rf"draft-{re.escape(loss)}(-.+)?\.metrics\.jsonl", path.name)))
        sets.setdefault(suffix or "(first)", {})[loss] = heldout_alpha(path)
    lines = ["| set | " + " | ".join(f"{loss} alpha 1 / 2 / 3" for loss in LOSSES) + " |",
             "|---|" + "---|" * len(LOSSES)]
    for name, by_loss in sets.items():
        cells = [" / ".join(f"{a:.3f}" for a in by_loss[loss]) if loss in by_loss else "-" for loss in LOSSES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| depth-1 alpha | sets | mean difference | 95% interval (t over sets) |", "|---|---|---|---|"]
    first = LOSSES[0]
    for other in LOSSES[1:]:
        diffs = np.array([s[first][0] - s[other][0] for s in sets.values() if first in s and other in s])
        if len(diffs) > 1:
            lo, hi = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
            ci = f"{lo:+.4f} to {hi:+.4f}"
        else:
            ci = "one set: none"
        lines.append(f"| {first} - {other} | {len(diffs)} | {diffs.mean():+.4f} | {ci} |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
