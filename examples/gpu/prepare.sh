#!/usr/bin/env bash
# Lay out here, under .gpu/ (git-ignored), what examples/gpu/check.sh needs on a bare GPU machine, and print the
# device calls that bring it there:
#   bash examples/gpu/prepare.sh
# - the gguf wheel (the machine's image lacks it; the rest of bebop's needs are there);
# - the default model's GGUF (94 MiB) in parts, with its checksum: one call carries at most 64 MiB, the working
#   tree's tracked files included, so each part fills what a call has left, and the parts go over consecutive calls
#   to the same warm machine (ignored paths a call carried stay there while it is warm, 30 s after a call).
# It refuses where the tracked files leave too little room for the model to go in a few calls.
set -euo pipefail
LIMIT_MIB=${BEBOP_CALL_LIMIT_MIB:-64}; MARGIN_MIB=2; MAX_CALLS=4  # (the override is for trying the split here)
PY=${PYTHON:-.venv/bin/python}
mkdir -p .gpu && rm -f .gpu/model-part-* .gpu/*.whl
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu "gguf==$($PY -c \
  'import importlib.metadata as m; print(m.version("gguf"))')"
GGUF=$($PY -c "from bebop.models.registry import smollm2_gguf; import os; print(os.path.join(*smollm2_gguf()))")
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
wheel=$(du -cb .gpu/*.whl | tail -1 | cut -f1)
room=$(( LIMIT_MIB * 1048576 - tree - wheel - MARGIN_MIB * 1048576 ))
model=$(stat -c %s "$GGUF")
echo "working tree $((tree / 1048576)) MiB, wheel $((wheel / 1024)) KiB: $((room / 1048576)) MiB left per call; model $((model / 1048576)) MiB"
if [ "$room" -le 0 ] || [ $(( (model + room - 1) / room )) -gt "$MAX_CALLS" ]; then
  echo "prepare: the model would need more than $MAX_CALLS calls; shrink the tracked files first" >&2
  exit 1
fi
split -b "$room" -d -a 2 "$GGUF" .gpu/model-part-
(cd .gpu && cat model-part-* > model.gguf && sha256sum model.gguf > model.sha256 && rm model.gguf)
parts=(.gpu/model-part-*)
echo "device calls, one after another while the machine stays warm (the last one runs the check):"
for i in "${!parts[@]}"; do
  extra=""; [ "$i" = 0 ] && extra=", \".gpu/model.sha256\", \"$(ls .gpu/*.whl)\""
  if [ "$i" = $(( ${#parts[@]} - 1 )) ]; then cmd="bash examples/gpu/check.sh"; else cmd="ls -l .gpu"; fi
  echo "  run(carry=[\"${parts[$i]}\"$extra], command=\"$cmd\", timeout_s=$([ "$cmd" = "ls -l .gpu" ] && echo 60 || echo 560))"
done
