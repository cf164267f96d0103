# Why Self-Attention: `make book` builds and checks the book, `make test` runs the tests.
# Both create .venv from the lock, requirements.txt, on first use (and again when it changes).

PYTHON ?= python3
PYTEST_WORKERS ?= 2
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.pins

# Offline and reproducible: no hub downloads, fixed hashing. No MPLBACKEND: a Jupyter kernel that
# inherits MPLBACKEND=Agg shows no figure (matplotlib picks Agg by itself where there is no screen).
export PATH := $(CURDIR)/$(BIN):$(PATH)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export PYTHONHASHSEED := 0
export TOKENIZERS_PARALLELISM := false
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: book test slow-test env sync check-sync execute check-numbers numbers ledger html tables clean lab serve

## book: install if needed, check the pairs, execute the stale notebooks (every one with FRESH=1)
## into the cache, render the site from it, check every number
book: env
	$(BIN)/python scripts/book.py build$(if $(filter 1 true yes,$(FRESH)), --fresh)

## test: install if needed, lint scripts/ and tests/, run the tests of the helpers and the build
## (tests/helpers, tests/build) but those marked slow; no notebook of the book runs there as it
## does in `make book` (the site's tests: `make site-test`)
test: env
	$(BIN)/ruff check scripts tests
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" tests/helpers tests/build

## slow-test: the tests marked slow (Parts 2 and 5 executed on simulated machines, every model
## type of transformers priced and built on the meta device); CI runs them after `make test`
slow-test: env
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal -m slow tests/helpers tests/build

## env: create .venv with the locked packages and the book's helpers (only when missing or the lock changed)
env: $(STAMP)

PINS := requirements.txt

# The lock holds every package: installed as it is, nothing resolved (requirements.txt says why).
$(STAMP): $(PINS) pyproject.toml
	@if [ -d $(VENV) ] && ! grep -hv '^#' $(PINS) | cmp -s - $(STAMP); then \
		echo "the pins changed: recreating $(VENV)"; rm -rf $(VENV); fi
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-deps -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	grep -hv '^#' $(PINS) > $(STAMP)      # the pins without their comments

## compat: the declared lowest torch and transformers, then the path Colab takes (`pip install` of the
## package); in each, every .ipynb alone in an empty folder and the number check; own environments
.PHONY: compat
compat: env
	$(BIN)/python scripts/book.py compat

## sync: re-pair every notebooks/*.md with its .ipynb (after an edit in either), outputs stripped
sync: env
	$(BIN)/python scripts/book.py sync

check-sync: env
	$(BIN)/python scripts/book.py check-sync

## execute: execute the stale notebooks (FRESH=1: again; PAGES="01_costs …": only those pages)
execute: env
	$(BIN)/python scripts/book.py execute$(if $(filter 1 true yes,$(FRESH)), --fresh) $(PAGES)

## check-numbers: compare the last build's glued numbers with numbers.toml (PAGES: only those)
check-numbers: env
	$(BIN)/python scripts/book.py check-numbers $(PAGES)

## numbers: accept the last build's glued numbers into numbers.toml and print the diff (PAGES: only those)
numbers: env
	$(BIN)/python scripts/book.py numbers $(PAGES)

ledger: env
	$(BIN)/python scripts/book.py ledger

html: env
	$(BIN)/python scripts/book.py html

## tables: print every table of the book as plain text
tables: env
	$(BIN)/python scripts/tx_part4.py

## lab: open the notebooks in JupyterLab (the repository is its root; --allow-root: containers
## and CI run as root, where Jupyter refuses to start without it; for anyone else it changes nothing)
LAB_ARGS ?=
lab: env
	$(BIN)/jupyter lab --allow-root --ServerApp.root_dir="$(CURDIR)" \
		--FileContentsManager.preferred_dir=notebooks $(LAB_ARGS)

.PHONY: pdf
## pdf: the book as one PDF, _build/pdf/why-self-attention.pdf, from the notebooks `make book` executed
pdf: env
	$(BIN)/python scripts/book.py pdf

## serve: serve the built site on http://localhost:8000
serve:
	$(PYTHON) -m http.server 8000 --directory _build/html

## clean: remove the build (keeps .venv)
clean:
	rm -rf _build book/ledger.md book/exercises.md

# ── CI: the steps of .ci/run and .github/workflows/ that are not the targets above ────────────

.PHONY: chromium site-test newest
## chromium: Debian's chromium (for `make pdf`) and its driver (for the site tests), as root, as CI runs
chromium:
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver > /dev/null

## site-test: after `make book` and `make pdf`: the PDF and the site tests (tests/site), where a
## missing site or browser is a failure, not a skip
site-test: env
	$(BIN)/python -m pytest tests/site --require-site

## newest: .venv with the newest releases within pyproject.toml's ranges (torch: the newest CPU build),
## then `make book` uses it as it is (the weekly workflow); `make env` goes back to the pins
## whenever requirements.txt changes. The versions go to the job summary in a workflow.
newest:
	$(PYTHON) scripts/book.py newest

## lock: rewrite requirements.txt, every package .venv holds at its installed version, keeping its
## header (after `.venv/bin/pip install NAME==VERSION`; `make env` installs exactly the lock)
.PHONY: lock
lock: env
	{ grep '^#' requirements.txt; \
	  $(BIN)/python -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > requirements.lock.new
	mv requirements.lock.new requirements.txt
