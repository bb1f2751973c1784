# jointspace GPU service image: the pinned install of `make install`, with faiss-gpu instead of faiss-cpu.
#
#   docker build -t jointspace:gpu .            (or: docker compose build)
#   docker compose up -d                        (see docker-compose.yml and docs/deploy.md)
#
# CUDA: torch 2.15.0 from PyPI brings the CUDA 13 runtime as wheels (site-packages/nvidia/cu13/lib); faiss-gpu
# 1.15.1 is linked against CUDA 12 (libcudart.so.12, libcublas.so.12) and pulls the CUDA 12 runtime wheels
# (nvidia-cuda-runtime-cu12, nvidia-cublas-cu12, nvidia-curand-cu12, pinned in constraints.txt) into
# site-packages/nvidia/{cuda_runtime,cublas,curand}/lib, which `import faiss` loads by full path. Both runtimes
# live in one process: their sonames differ and every CUDA symbol is versioned (cublasCreate_v2@libcublas.so.12
# vs @@libcublas.so.13), so each library binds to its own runtime, and both run on one driver >= 580 (CUDA 13's
# minimum, which also runs CUDA 12 code). No LD_LIBRARY_PATH is needed. The CUDA 13 base image makes the NVIDIA
# container runtime refuse an older driver at start, with a clear message, instead of failing at first use.
# BASE_IMAGE: another Debian-family base with Python >= 3.11 in its archive (e.g. a Debian 12 image made locally
# where no registry is reachable, docs/deploy.md); the CUDA libraries come from the wheels either way, so only the
# driver check at start is the CUDA base image's own.
ARG BASE_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# the base's Python: 3.12 on Ubuntu 24.04, 3.11 on Debian 12 (jointspace needs >= 3.11; every pin in
# constraints.txt has wheels for both); Tesseract and its English data for OCR at index time (index/ocr.py)
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates tesseract-ocr tesseract-ocr-eng \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv "$VIRTUAL_ENV"

WORKDIR /opt/jointspace
# every package installed is pinned by constraints.txt: pip, setuptools and wheel first (the build backend, used
# without build isolation so that it is the pinned one), then the dependencies and the gpu extra as pyproject.toml
# lists them (their own layer: a change to the code reuses it), then jointspace itself
COPY pyproject.toml constraints.txt ./
RUN python -m pip install -c constraints.txt pip setuptools wheel \
    && python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['gpu']))" > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY README.md ./
COPY training ./training
COPY index ./index
COPY service ./service
COPY configs ./configs
RUN pip install --no-build-isolation --no-deps -c constraints.txt '.[gpu]' \
    && pip check \
    && python -c "import faiss, torch; assert hasattr(faiss, 'StandardGpuResources'), 'faiss without GPU support'; print('faiss', faiss.__version__, 'torch', torch.__version__, 'CUDA', torch.version.cuda)"

# model, index and photos are mounted, never baked in or downloaded: model.pt is self-contained (weights,
# vocabulary, preprocessing), so nothing is fetched at start. The service runs as uid 10001 by default; compose
# runs it as JOINTSPACE_UID:JOINTSPACE_GID (the host user owning the bind-mounted folders, docs/deploy.md), which
# needs nothing from /etc/passwd: HOME is /tmp, the one place anything may want to write besides /indexes.
RUN useradd --create-home --uid 10001 --user-group jointspace \
    && mkdir -p /models /indexes /images \
    && chown jointspace:jointspace /models /indexes /images
USER 10001:10001
VOLUME ["/models", "/indexes", "/images"]

ENV HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    JOINTSPACE_HOST=0.0.0.0 \
    JOINTSPACE_PORT=8000 \
    JOINTSPACE_MODEL=/models/model.pt \
    JOINTSPACE_INDEX=/indexes/gallery \
    JOINTSPACE_DEVICE=auto
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('JOINTSPACE_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["jointspace"]
CMD ["serve"]
