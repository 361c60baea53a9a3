#!/bin/bash
# The paper's finding 3 with seed replicates: one EAGLE-3 draft per loss and training seed (e2e-TV, then its
# rivals: hard-label CE, SpecForge's soft CE / KL, and LK), all at equal data and budget, from the target's own
# samples, with a 4,096-token draft vocabulary as the shipped draft has; teacher-forced held-out alpha per depth
# and the engine's mean acceptance length on held-out prompts, compared on seed means with 95% intervals
# (`bebop compare-losses --seeds`). Every stage resumes where a kill left it: run this again to continue.
# Each finished draft's evaluation and training metrics go into the results directory as it finishes
# (`--keep`), so a machine without this one's runs/ goes on from the committed files with the drafts not yet
# kept: the self-distilled data are made again there (fp32, same seed: the same recipe, on another CPU kind not
# bit for bit the same samples).
#   bash examples/finding3_runs.sh            (hours on 2 cores; one heavy job: pause it for benchmarks)
#   bash examples/finding3_runs.sh --seeds 5  (more seeds later: only the new ones train)
set -e
BEBOP=${BEBOP:-.venv/bin/bebop}
W=runs/finding3 R=results/compare-losses-eagle3-seeds SEEDS=3
[ "${1:-}" = --seeds ] && SEEDS=$2
mkdir -p $W $R

# 1. self-distilled data: the target's samples of the built-in chat, math and code prompts
[ -f $W/data/heldout.jsonl ] || $BEBOP make-data --model smollm2-135m --num-samples 1200 --heldout-samples 128 \
    --max-new-tokens 96 --temperature 1.0 --batch-size 64 --seed 3 --dtype float32 --out $W/data

# 2. the drafts and their comparison (a rerun reuses every finished draft and evaluation)
$BEBOP compare-losses --model smollm2-135m --data $W/data --kind eagle3 --losses e2e-tv,ce,kl,lk --seeds $SEEDS \
    --draft-len 3 --draft-vocab 4096 --steps 600 --batch-size 8 --learning-rate 5e-4 --max-seq-len 384 --eval-every 600 \
    --eval-sequences 128 --eval-prompts 0 --save-every 50 --features-dtype float32 --autocast off \
    --temperatures 1.0 --final-eval-prompts 32 --max-new-tokens 64 --seed 0 --out $W/compare --keep $R

# 3. the report beside the kept runs (the drafts stay in $W; every device call of the GPU check carries the
#    tracked files)
cp $W/compare/compare.md $W/compare/compare.json $W/compare/compare.png $R/
