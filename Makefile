# jointspace — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := demo
HOST   ?= 127.0.0.1
PORT   ?= 8000
# the browser tests (tests/test_web.py) drive Debian's Chromium with Playwright's Python package
CHROMIUM_PACKAGES := chromium chromium-driver fonts-dejavu-core
# OCR at index time (index/ocr.py, `index build --ocr`) runs Debian's Tesseract with its English data
TESSERACT_PACKAGES := tesseract-ocr tesseract-ocr-eng

.PHONY: install test lint demo demo-train clean chromium ocr screenshots

# The install's disk need (x86_64, Python 3.11, measured 2026-12-01): the venv takes about 7.8 GB, 5.5 GB of it torch
# with its CUDA libraries and triton (PyPI's Linux torch is the CUDA build). pip holds the wheels it downloads in
# TMPDIR until it has installed them all, so torch and torchvision go in first, on their own: 2.5 GB of wheels beside
# 5.5 GB installed, then 0.8 GB beside 7.8 GB (in one step: 3.3 GB beside 7.8 GB). Short of that, a loud warning
# names what is free where; the install still runs, since a venv left by an earlier try needs less.
VENV_NEED_MB := 8000
WHEELS_NEED_MB := 2600
ONE_DISK_NEED_MB := 8800
define check_free_disk
	@tmp="$${TMPDIR:-/tmp}"; \
	set -- $$(df -Pm . "$$tmp" 2>/dev/null | awk 'NR > 1 {print $$NF, $$4}'); \
	[ $$# -eq 4 ] || exit 0; \
	venv_free=$$2; tmp_free=$$4; \
	if [ "$$1" = "$$3" ]; then \
		short=$$([ "$$venv_free" -lt $(ONE_DISK_NEED_MB) ] && echo yes); \
	else \
		short=$$([ "$$venv_free" -lt $(VENV_NEED_MB) ] || [ "$$tmp_free" -lt $(WHEELS_NEED_MB) ] && echo yes); \
	fi; \
	if [ -n "$$short" ]; then \
		echo "!!!!! make install needs about $(VENV_NEED_MB) MB free for $(VENV)/ and $(WHEELS_NEED_MB) MB in $$tmp"; \
		echo "!!!!! (TMPDIR) for pip's downloads, $(ONE_DISK_NEED_MB) MB when both are on one disk; free now:"; \
		echo "!!!!! $$venv_free MB here, $$tmp_free MB in $$tmp. pip stops with 'No space left on device'"; \
		echo "!!!!! when it runs out."; \
	fi
endef

# --no-cache-dir: the downloaded wheels (torch's CUDA libraries alone are several GB) are not kept a second time in
# pip's cache beside the installed packages, so that the install fits on a machine with little free disk; torch and
# torchvision go in first, for the same reason (above).
# PYTHONWARNINGS: setuptools prints a note on every editable install ("Editable installation ... folders with the
# same name as your package"), advice on editable installs in general, not a warning about this project
$(BIN)/jointspace: pyproject.toml constraints.txt
	$(call check_free_disk)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-cache-dir -c constraints.txt torch torchvision
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install --quiet --no-cache-dir -c constraints.txt \
		-e '.[cpu,dev,ray]'
	@touch $@

install: $(BIN)/jointspace  ## create .venv and install the pinned project

test: lint $(BIN)/jointspace chromium ocr  ## lint, then the whole test suite
	$(BIN)/python -m pytest -q

# ruff (rules in pyproject.toml) over all the Python code; mypy (settings in pyproject.toml) over the three
# packages. `ruff format` is not run.
lint: $(BIN)/jointspace  ## ruff check, and mypy on training/ index/ service/
	$(BIN)/ruff check training index service tests benchmarks
	$(BIN)/mypy training index service

# $(call apt_or_warn,PRESENT,NAME,PACKAGES,WHAT NEEDS IT): nothing when the shell test PRESENT succeeds; else the
# Debian PACKAGES installed with apt-get where it runs as root; else a loud warning that WHAT NEEDS IT is skipped
define apt_or_warn
	@if $(1); then \
		exit 0; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "$(2) is missing: apt-get install $(3) (for $(4))"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq -o DPkg::Lock::Timeout=300 \
		&& apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 $(3) \
		|| echo "!!!!! $(2) could not be installed: $(4) will not run !!!!!"; \
	else \
		echo "!!!!! $(2) is not installed and cannot be installed here (needs root and apt-get):"; \
		echo "!!!!! $(4) will be SKIPPED. Install it with:"; \
		echo "!!!!!     sudo apt-get install $(3)"; \
	fi
endef

chromium:  ## Chromium for the browser tests: installed with apt-get when missing (root), else a loud warning
	$(call apt_or_warn,[ -n "$$JOINTSPACE_CHROMIUM" ] || [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1,Chromium,$(CHROMIUM_PACKAGES),the browser tests (tests/test_web.py; or set JOINTSPACE_CHROMIUM to a Chromium binary))

ocr:  ## Tesseract (OCR at index time; tests/test_keywords.py): installed with apt-get when missing (root), else a loud warning
	$(call apt_or_warn,command -v tesseract >/dev/null 2>&1 && tesseract --list-langs 2>/dev/null | grep -qx eng,Tesseract,$(TESSERACT_PACKAGES),the OCR tests (tests/test_keywords.py) and reading text in photos at index time)

# `make demo PORT=8001` serves on another port, `HOST=0.0.0.0` on every interface; a port in use is refused at
# once (jointspace serve binds it before loading the model)
demo: $(DEMO)/photos-index/CURRENT  ## real photos searched with the shipped model, served on HOST:PORT (127.0.0.1:8000)
	@echo ""
	@echo "jointspace demo: open http://$(HOST):$(PORT)/ and search $(DEMO)/samples/photos (photos and two short"
	@echo "  videos made from them) with a sentence"
	@echo "  (the shipped model, docs/model-card.md; photo credits in $(DEMO)/samples/ATTRIBUTION.md; Ctrl-C stops)"
	@echo "or try the API from another terminal:"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/v1/search/images -H 'content-type: application/json' \\"
	@echo "       -d '{\"text\": \"a man with a camera\", \"k\": 3}'"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/v1/search/images -H 'content-type: application/json' \\"
	@echo "       -d '{\"text\": \"a cat\", \"k\": 3, \"media\": \"video\"}'     # moments of the videos"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/v1/search/captions -F image=@$(DEMO)/samples/photos/cat.jpg -F k=3"
	@echo "  curl -s -o photo0 http://$(HOST):$(PORT)/v1/images/0      # ?size=128 for a thumbnail"
	@echo "To search your own photos: jointspace index build --images ~/photos --out gallery (README)."
	@echo ""
	$(BIN)/jointspace serve --index $(DEMO)/photos-index --host $(HOST) --port $(PORT)

$(DEMO)/samples/captions.txt: | $(BIN)/jointspace
	$(BIN)/jointspace index samples --out $(DEMO)/samples

# the shipped model is a prerequisite: an index built with an earlier model file is rebuilt, not refused by serve
$(DEMO)/photos-index/CURRENT: $(DEMO)/samples/captions.txt training/pretrained/flickr8k.pt
	$(BIN)/jointspace index build --images $(DEMO)/samples/photos --captions $(DEMO)/samples/captions.txt \
		--out $(DEMO)/photos-index --workers 0

screenshots: $(DEMO)/photos-index/CURRENT chromium  ## the search page, desktop and phone, light and dark: docs/screenshots/
	$(BIN)/python tests/screenshots.py --index $(DEMO)/photos-index --out docs/screenshots

demo-train: $(DEMO)/index/CURRENT $(DEMO)/eval.json  ## synthetic data → train configs/demo.yaml → index → serve on :8000
	@echo ""
	@echo "jointspace demo-train: open http://$(HOST):$(PORT)/ in a browser to search the synthetic test split"
	@echo "  (API docs: http://$(HOST):$(PORT)/docs; Ctrl-C stops)"
	@echo "or try the API from another terminal:"
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

# the shipped model's concept head, refitted from scratch on the Flickr8k training split (docs/model-card.md): the
# settings below were selected on Flickr8k dev, the ImageNet samples and the demo gallery (benchmarks/open_vocab.py)
FLICKR8K ?= ../shared/datasets/flickr8k
CONCEPTS := --set concepts.weight=1.25 --set concepts.confidence_floor=0.48 --set concepts.confidence=10 \
	--set concepts.confidence_at=0.3 --set concepts.familiar_weight=0.75 --set concepts.person_discount=0.35
.PHONY: concepts
concepts: $(BIN)/jointspace  ## refit training/pretrained/flickr8k.pt's concept head (COSMO gate) and its query bank on FLICKR8K
	$(BIN)/jointspace concepts --model training/pretrained/flickr8k.pt --data $(FLICKR8K) $(CONCEPTS)

.PHONY: docs
docs: $(BIN)/jointspace  ## rewrite the result tables (from benchmarks/results/) and the config reference in the docs
	$(BIN)/python benchmarks/config_reference.py
	$(BIN)/python benchmarks/tables.py

clean:
	rm -rf $(DEMO) .pytest_cache
