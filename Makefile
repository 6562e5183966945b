# `make test` and `make bench` each set up .venv on a fresh machine by themselves;
# `make bench` also sets up the peers' environments of the records benchmark (`make peers`).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PEERS     := .venv-peers
PEERS_MDS := .venv-peers-mds
TV        := .venv-torchvision
PEERS_LANCE := .venv-peers-lance
REQ       := benchmarks/requirements

.PHONY: test test-matrix bench lint install peers clean docs docs-serve test-torchvision

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# the CPU build first: a looser requirement alone would pull a multi-GB CUDA build
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[torch,pandas,dask,remote,bench,dev]'
	# Azurite, the Azure Blob Storage emulator of the az:// tests (an npm package)
	if command -v npm > /dev/null; then npm install --silent --no-audit --no-fund \
	  --prefix $(VENV)/azurite azurite@3.37.0; else echo "no npm: the az:// tests will skip"; fi
	touch $(STAMP)

install: $(STAMP)

# The tests in TEST_JOBS processes (pytest-xdist), a test module's tests in one of them, so
# that a module's expensive fixture (a benchmark's smoke run) is made once.
TEST_JOBS ?= 2

# Byte-compiled first, as an installed package is: where PYTHONDONTWRITEBYTECODE is set, each
# worker process of a build would otherwise compile the package from source when it starts.
# The torchvision environment installs (mostly reading 5.5 GB from disk) while the main run
# goes on; its suite runs after it.
test: lint
	$(BIN)/python -m compileall -q tensorstore_cache benchmarks tests > /dev/null
	( $(MAKE) --no-print-directory $(TV)/.installed > $(TV).log 2>&1; echo $$? > $(TV).rc ) & \
	  $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile; rc=$$?; wait; \
	  test $$rc -eq 0 || exit $$rc; \
	  test "$$(cat $(TV).rc)" = 0 || { tail -n 20 $(TV).log; echo "$(TV) did not install"; exit 1; }
	$(MAKE) --no-print-directory test-torchvision

# The torchvision suite (tests/test_torch/with_torchvision, left out of the .venv run by its conftest) in an
# environment of its own: torchvision 0.29.1 needs torch 2.14.1, which cannot sit beside the
# CPU build of .venv.
$(TV)/.installed: pyproject.toml Makefile
	test -x $(TV)/bin/python || $(PYTHON) -m venv $(TV)
	$(TV)/bin/python -m pip install --quiet --upgrade pip
	$(TV)/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(TV)/bin/python -m pip install --quiet -e '.[torch]' 'pytest>=8' 'pytest-timeout>=2.2'
	$(TV)/bin/python -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"
	touch $@

test-torchvision: $(TV)/.installed
	$(TV)/bin/python -m pytest -q -p no:cacheprovider tests/test_torch/with_torchvision

# The suites that need neither torch nor the peers on Python 3.12 and 3.13 with the newest
# releases, and on Python 3.11 with the oldest that pyproject.toml allows, each in its own venv
# (.venv-3.12, .venv-3.13, .venv-3.11-oldest), set up by .ci/matrix itself; .ci/run runs it beside
# `make test`, at the lowest CPU priority. The folders, the versions: docs/development.md.
test-matrix:
	bash .ci/matrix

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The documentation site (mkdocs.yml): built strictly into site/, or served while editing.
# The tests build it too (tests/test_project/test_docs.py), with every example of the pages run.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run
	$(BIN)/python -m benchmarks.sweep
	$(MAKE) --no-print-directory peers
	$(BIN)/python -m benchmarks.records
	$(BIN)/python -m benchmarks.embed

# The peers of benchmarks/records/records.py, each environment logged to its .log. A peer that does
# not install is not an error here: the benchmark reports it as not installed, with why.
peers:
	@for venv in $(PEERS) $(PEERS_MDS) $(PEERS_LANCE); do \
	  echo "setting up $$venv (log: $$venv.log)"; \
	  $(MAKE) --no-print-directory $$venv/.installed > $$venv.log 2>&1 \
	    || { tail -n 15 $$venv.log; echo "$$venv is incomplete (see $$venv.log):" \
	         "benchmarks.records reports its methods as not installed"; }; \
	done

# torch as in .venv (the CPU build, first); litData without its torchvision requirement
$(PEERS)/.installed: $(REQ)/peers.txt $(REQ)/peers-nodeps.txt
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet torch==2.13.0
	$(PEERS)/bin/python -m pip install --quiet --no-deps -r $(REQ)/peers-nodeps.txt
	$(PEERS)/bin/python -m pip install --quiet -r $(REQ)/peers.txt
	$(PEERS)/bin/python -c "import datasets, litdata, torch; print(torch.__version__)"
	touch $@

# `import streaming` needs torchvision: torch 2.14.1 + torchvision 0.29.1 (see peers-mds.txt)
$(PEERS_MDS)/.installed: $(REQ)/peers-mds.txt $(REQ)/peers-mds-nodeps.txt
	test -x $(PEERS_MDS)/bin/python || $(PYTHON) -m venv $(PEERS_MDS)
	$(PEERS_MDS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_MDS)/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PEERS_MDS)/bin/python -m pip install --quiet --no-deps -r $(REQ)/peers-mds-nodeps.txt
	$(PEERS_MDS)/bin/python -m pip install --quiet -r $(REQ)/peers-mds.txt
	$(PEERS_MDS)/bin/python -c "import streaming, torch, torchvision; print(torch.__version__)"
	touch $@

clean:
	rm -rf $(VENV) $(TV) $(TV).log $(TV).rc $(PEERS) $(PEERS_MDS) $(PEERS_LANCE) $(PEERS).log \
	  $(PEERS_MDS).log $(PEERS_LANCE).log build site *.egg-info \
	  .venv-3.12 .venv-3.13 .venv-3.11-oldest .venv-3.1*.log \
	  .pytest_cache .mypy_cache .ruff_cache

# Lance (pylance) with its own pyarrow and numpy, no torch (see peers-lance.txt)
$(PEERS_LANCE)/.installed: $(REQ)/peers-lance.txt
	test -x $(PEERS_LANCE)/bin/python || $(PYTHON) -m venv $(PEERS_LANCE)
	$(PEERS_LANCE)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_LANCE)/bin/python -m pip install --quiet -r $(REQ)/peers-lance.txt
	$(PEERS_LANCE)/bin/python -c "import lance, pyarrow; print(lance.__version__, pyarrow.__version__)"
	touch $@
