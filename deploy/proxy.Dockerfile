# The reverse proxy of the `replicas` profile (docker-compose.yml): HAProxy from the base's Debian/Ubuntu
# archive with deploy/haproxy.cfg, running as nobody (65534) on port 8080. BASE_IMAGE: any Debian-family image
# with haproxy >= 2.0 in its archive (the same knob as the service image's, docs/deploy.md).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy \
    && rm -rf /var/lib/apt/lists/* \
    && haproxy -v
COPY haproxy.cfg /etc/haproxy/haproxy.cfg
RUN haproxy -c -f /etc/haproxy/haproxy.cfg
USER 65534:65534
EXPOSE 8080
ENTRYPOINT ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
