"""Teacher-forced held-out acceptance (alpha per depth, E[A], per task kind) of MTP checkpoints on a make-data
directory's held-out split, from the feature store that `train-draft` keeps there (computed if missing).

    python examples/mtp_heldout_eval.py --data runs/mtp8/data --eval-sequences 384 \
        bebop/checkpoints/smollm2-135m-mtp-v4 runs/mtp8/one-block runs/mtp8/eagle3
"""
import argparse
import copy
import json

import torch

from bebop.training.data import load_meta, load_split
from bebop.training.features import TargetFeatures
from bebop.models.registry import load_model
from bebop.drafts.registry import load_mtp
from bebop.training.train import feature_store, teacher_forced_eval

parser = argparse.ArgumentParser()
parser.add_argument("mtps", nargs="+")
parser.add_argument("--model", default="smollm2-135m")
parser.add_argument("--data", required=True)
parser.add_argument("--eval-sequences", type=int, default=64)
parser.add_argument("--max-seq-len", type=int, default=384)
parser.add_argument("--draft-len", type=int, default=3)
parser.add_argument("--features-dtype", default="bfloat16", choices=("float32", "bfloat16"),
                    help="the dtype the store was computed in (train-draft's choice), so that it is reused")
args = parser.parse_args()

model, _ = load_model(args.model, dtype="float32")
T = load_meta(args.data).get("temperature") or 1.0
compute = copy.deepcopy(model).to(torch.bfloat16) if args.features_dtype == "bfloat16" else None
rows = load_split(args.data, "heldout")[:args.eval_sequences]
store = feature_store(args.data, f"heldout{args.eval_sequences}", model, T, args.max_seq_len)
for path in args.mtps:
    mtp = load_mtp(path, model)
    feats = TargetFeatures(model, rows, T, args.max_seq_len, mtp.feature_layers, store, compute_model=compute)
    print(json.dumps({"mtp": path, "step": mtp.config.meta.get("step"),
                      **teacher_forced_eval(mtp, feats, args.draft_len, T)}), flush=True)
