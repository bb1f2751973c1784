# jointspace — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := demo

.PHONY: install test demo clean

$(BIN)/jointspace: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	@touch $@

install: $(BIN)/jointspace  ## create .venv and install the pinned project

test: $(BIN)/jointspace  ## the whole test suite
	$(BIN)/python -m pytest -q

demo: $(BIN)/jointspace  ## synthetic data → train configs/demo.yaml → evaluate on its test split
	$(BIN)/jointspace synth --out $(DEMO)/data --images 3000 --seed 0
	$(BIN)/jointspace train --config configs/demo.yaml --data $(DEMO)/data --out $(DEMO)/run
	$(BIN)/jointspace evaluate --model $(DEMO)/run/model.pt --data $(DEMO)/data --split test \
		--out $(DEMO)/eval.json --plot $(DEMO)/eval.png

clean:
	rm -rf $(DEMO) .pytest_cache
