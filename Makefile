# cpcourse: `make lab` opens the course, `make test` runs every test, `make demo` runs the ring
# and draws a clip (demo.gif) with the trained tiny video model under CP.
# Every target creates .venv when it is missing and is safe to run again.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.cpcourse-installed
PORT   ?= 8888
NPROC  ?= 4

.PHONY: setup lab test test-fast demo gpu exercises notebooks lint clean-venv book

setup: $(STAMP)

$(STAMP): pyproject.toml tools/install_torch.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	bash tools/install_torch.sh $(PY)
	$(PY) -m pip install --no-input -q -e '.[dev]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	$(PY) -m cpcourse.course.labsettings
	@touch $(STAMP)

# Lab on the repository root (exercises/ beside notebooks/), opening notebook 00, each notebook
# listed once: tools/jupyter_lab_config.py.
lab: setup
	$(VENV)/bin/jupyter lab --config=tools/jupyter_lab_config.py --port=$(PORT) $(if $(filter 0,$(shell id -u)),--allow-root,)

test: setup
	$(PY) tools/run_tests.py

test-fast: setup
	$(PY) -m pytest -q -m "not notebook and not browser" tests

demo: setup
	$(VENV)/bin/cpcourse demo --nproc $(NPROC)
	$(VENV)/bin/cpcourse generate --prompt circle-right --nproc 2 --gif demo.gif --force --compare

# The prepared GPU check (tools/gpu_check/; `cpcourse bench gpu` runs it too): CUDA tests,
# kernel rates, real-size models beside the planner, written to artifacts/gpu.json (OUT=... elsewhere, e.g.
# cpcourse/data/gpu_measured_h100.json). DRY=1 runs the same code on the CPU.
gpu: setup
	$(PY) -m tools.gpu_check $(if $(DRY),--dry-run --out artifacts/gpu-dry.json,$(if $(OUT),--out $(OUT),)) --force

exercises: setup
	$(PY) tools/make_exercises.py

# The text forms (notebooks/NN_topic.md) and the .ipynb files are jupytext pairs: --sync takes each
# pair's cells from whichever file was saved last, then the .ipynb files lose their outputs, and
# the text forms are touched so that they stay the newer file of each pair, as jupytext expects.
notebooks: setup
	$(VENV)/bin/jupytext --sync notebooks/[0-9]*.md
	$(VENV)/bin/jupyter nbconvert --clear-output --inplace --log-level=WARN notebooks/[0-9]*.ipynb
	touch notebooks/[0-9]*.md

lint: setup
	$(PY) -m ruff check cpcourse tests tools solutions exercises

clean-venv:
	rm -rf $(VENV)

# The course as a website (book/conf.py): every notebook executed on its untouched stubs, with
# its outputs, into _build/html (open _build/html/index.html). Execution is cached in
# _build/.jupyter_cache: a rebuild re-runs only notebooks whose code changed.
# BOOK_NOTEBOOKS=00_token_explosion,07_tiny_dit_under_cp builds a subset.
book: setup
	CPCOURSE_IMPL=exercises CPCOURSE_ROOT=$(CURDIR) IPYTHONDIR=$(CURDIR)/book/ipython \
	OMP_NUM_THREADS=1 MPLBACKEND=module://matplotlib_inline.backend_inline \
	$(VENV)/bin/sphinx-build -q -c book . _build/html
	@echo "open _build/html/index.html"
