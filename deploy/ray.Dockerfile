# The jointspace image with the `ray` extra: the nodes of the Ray cluster of deploy/compose.ray.yaml, which embed a
# gallery with `jointspace index build --engine ray` (docs/scale.md). Built on the service image, so the head,
# the workers and the service run the same jointspace, torch and FAISS; Ray and its dependencies are pinned by
# constraints.txt like everything else.
#
#   docker compose build                                          (the service image, jointspace:gpu)
#   docker compose -f deploy/compose.ray.yaml --profile ray build (this one, jointspace:ray)
ARG BASE_IMAGE=jointspace:gpu
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
USER 0:0
WORKDIR /opt/jointspace
RUN pip install --no-cache-dir --no-build-isolation -c constraints.txt '.[gpu,ray]' \
    && pip check \
    && python -c "import ray, ray.data; print('ray', ray.__version__)"
USER 10001:10001
# Ray keeps its session files (logs, sockets, spilled objects) under /tmp/ray; HOME is /tmp already
ENTRYPOINT ["jointspace"]
CMD ["serve"]
