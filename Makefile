# jointspace — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := demo
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: install test demo clean

$(BIN)/jointspace: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[cpu,dev]'
	@touch $@

install: $(BIN)/jointspace  ## create .venv and install the pinned project

test: $(BIN)/jointspace  ## the whole test suite
	$(BIN)/python -m pytest -q

demo: $(DEMO)/index/CURRENT $(DEMO)/eval.json  ## synthetic data → train configs/demo.yaml → index → serve on :8000
	@echo ""
	@echo "jointspace demo: http://$(HOST):$(PORT)   (API docs: http://$(HOST):$(PORT)/docs, Ctrl-C stops)"
	@echo "try, from another terminal:"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/v1/search/images -H 'content-type: application/json' \\"
	@echo "       -d '{\"text\": \"a red circle above a blue square\", \"k\": 5}'"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/v1/search/captions -F image=@$$(ls $(DEMO)/data/images/* | head -n 1) -F k=5"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/v1/search/captions -H 'content-type: application/json' -d '{\"image_id\": 0, \"k\": 5}'"
	@echo "  curl -s -o image0 http://$(HOST):$(PORT)/v1/images/0      # ?size=128 for a thumbnail"
	@echo "  curl -s http://$(HOST):$(PORT)/metrics | grep jointspace_batch"
	@echo ""
	$(BIN)/jointspace serve --model $(DEMO)/run/model.pt --index $(DEMO)/index --host $(HOST) --port $(PORT)

$(DEMO)/data/dataset.json: | $(BIN)/jointspace
	$(BIN)/jointspace synth --out $(DEMO)/data --images 3000 --seed 0

$(DEMO)/run/model.pt: $(DEMO)/data/dataset.json configs/demo.yaml
	$(BIN)/jointspace train --config configs/demo.yaml --data $(DEMO)/data --out $(DEMO)/run

$(DEMO)/eval.json: $(DEMO)/run/model.pt
	$(BIN)/jointspace evaluate --model $(DEMO)/run/model.pt --data $(DEMO)/data --split test \
		--out $(DEMO)/eval.json --plot $(DEMO)/eval.png

$(DEMO)/index/CURRENT: $(DEMO)/run/model.pt
	$(BIN)/jointspace index build --model $(DEMO)/run/model.pt --data $(DEMO)/data --split test --out $(DEMO)/index

clean:
	rm -rf $(DEMO) .pytest_cache
