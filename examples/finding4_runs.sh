#!/bin/bash
# The paper's finding 4 at RL length: pre-RL drafts distilled on the RL task's own prompts with three
# losses at equal data and compute, each frozen through a 100-step GRPO run, plus spec-greedy, an online
# strategy and ar; then the report. Every stage resumes where a kill left it: run this again to continue.
#   bash examples/finding4_runs.sh            (hours on 2 cores; one stage at a time, all threads each)
#   bash examples/finding4_runs.sh --replicates 3
#                 (then also seeds 1, 2, ... of the three frozen recipes until each has 3 runs, resumable like
#                  the rest; the report groups a recipe's runs and compares recipes on their run means)
set -e
BEBOP=${BEBOP:-.venv/bin/bebop}
W=runs/rl26 R=results/rl-finding4-smollm2-135m STEPS=100 REPLICATES=1
[ "${1:-}" = --replicates ] && REPLICATES=$2
mkdir -p $W $R

# 1. self-distilled data: the RL run's own train-split prompts (seed 0, the order bebop rl draws them)
[ -f $W/arithmetic-prompts.jsonl ] || .venv/bin/python examples/task_prompts.py --task arithmetic --num 800 \
    --seed 0 --out $W/arithmetic-prompts.jsonl
[ -f $W/data/heldout.jsonl ] || $BEBOP make-data --model smollm2-135m --prompts $W/arithmetic-prompts.jsonl \
    --num-samples 1200 --heldout-samples 120 --max-new-tokens 96 --temperature 1.0 --batch-size 64 --seed 26 \
    --out $W/data

# 2. three drafts from the same init (the shipped MTP v4), same data, steps, batch, lr and seed; only the loss differs
for loss in ce kl kl+e2e-tv; do
  out=$W/draft-$loss
  [ -f $out.safetensors ] && [ "$(python3 -c "import json;print(json.load(open('$out.json'))['meta']['step'])")" = 400 ] && continue
  resume=; [ -d $out.ckpt ] && resume=--resume
  $BEBOP train-draft --model smollm2-135m --data $W/data --init bebop/checkpoints/smollm2-135m-mtp-v4 --loss $loss \
    --feature-layers 2,15,27 --features-dtype bfloat16 --draft-len 3 --steps 400 --batch-size 8 --learning-rate 3e-4 \
    --max-seq-len 384 --eval-every 400 --eval-sequences 120 --eval-prompts 8 --save-every 50 --seed 0 \
    --out $out $resume
done

# 3. GRPO runs, same seed, task, batch and learning rate; K = 3 fixed so acceptance is comparable across runs
rl() {  # name, then the run's own options
  local out=$R/$1; shift
  [ -f $out/metrics.jsonl ] && [ "$(wc -l < $out/metrics.jsonl)" -ge $STEPS ] && return
  local resume=; [ -d $out/ckpt ] && resume=--resume
  $BEBOP rl --model smollm2-135m --task arithmetic --steps $STEPS --prompts-per-step 4 --num-generations 4 \
    --max-completion-length 96 --learning-rate 1e-5 --eval-every 25 --eval-prompts 32 --seed 0 --async-mode off \
    --draft-len 3 --save-every 5 --out $out $resume "$@"
}
rl spec-kl+e2e-tv --rollout spec --draft $W/draft-kl+e2e-tv --draft-strategy frozen
rl spec-ce --rollout spec --draft $W/draft-ce --draft-strategy frozen
rl spec-kl --rollout spec --draft $W/draft-kl --draft-strategy frozen
rl spec-greedy-kl+e2e-tv --rollout spec-greedy --draft $W/draft-kl+e2e-tv --draft-strategy frozen
rl spec-online-e2e-tv --rollout spec --draft $W/draft-kl+e2e-tv --draft-strategy online-e2e-tv
rl ar --rollout ar
# the first two runs again, on the machine that ran ar and online (wall times divide only within one CPU, and
# a recipe run twice shows the run-to-run spread that the step-paired intervals leave out)
rl spec-kl+e2e-tv-epyc --rollout spec --draft $W/draft-kl+e2e-tv --draft-strategy frozen
rl spec-ce-epyc --rollout spec --draft $W/draft-ce --draft-strategy frozen
# replicates with other seeds, until each frozen recipe has $REPLICATES runs (the runs above count: e2e-TV and CE
# two each, KL one)
replicate() {  # recipe, runs it has above, then its options
  local name=$1 have=$2; shift 2
  for seed in $(seq 1 $((REPLICATES - have))); do rl $name-seed$seed "$@" --seed $seed; done
}
replicate spec-kl+e2e-tv 2 --rollout spec --draft $W/draft-kl+e2e-tv --draft-strategy frozen
replicate spec-ce 2 --rollout spec --draft $W/draft-ce --draft-strategy frozen
replicate spec-kl 1 --rollout spec --draft $W/draft-kl --draft-strategy frozen

# 4. the report over every run that has steps
# (the e2e-TV run first: every other speculative run is compared with it step by step)
$BEBOP report $(for r in spec-kl+e2e-tv spec-ce spec-kl spec-greedy-kl+e2e-tv spec-online-e2e-tv spec-kl+e2e-tv-epyc \
    spec-ce-epyc $(cd $R && ls -d spec-*-seed* 2>/dev/null) ar; do
  [ -f $R/$r/metrics.jsonl ] && echo $R/$r; done) --out $R/report
# and the runs of one machine alone: online against the same draft frozen, step by step, and both against ar
$BEBOP report $(for r in spec-kl+e2e-tv-epyc spec-ce-epyc spec-online-e2e-tv ar; do
  [ -f $R/$r/metrics.jsonl ] && echo $R/$r; done) --out $R/report-one-cpu
