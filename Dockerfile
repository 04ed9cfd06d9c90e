# One image for every SkyPurza service; compose.yaml picks the service with `spz api serve --services`.
FROM python:3.11-slim
WORKDIR /opt/skypurza
COPY pyproject.toml README.md ./
COPY __init__.py ./
COPY events ./events
COPY services ./services
COPY cli ./cli
# SKYPURZA_HOME, a NATS node's store (/data) and the per-cluster agent users' directory are made
# here, owned by skypurza: compose.yaml mounts named volumes on them, and Docker gives a new volume
# the ownership of the image's directory there; a mount point missing from the image would be made
# root-owned and the service (or nats-server, which runs as skypurza too) could not write.
RUN pip install --no-cache-dir . && useradd --create-home --uid 1000 skypurza \
    && install -d -o skypurza -g skypurza -m 0700 /home/skypurza/.skypurza /data /var/lib/skypurza/bus-agents
USER skypurza
ENV SKYPURZA_HOME=/home/skypurza/.skypurza
ENTRYPOINT ["spz"]
CMD ["api", "serve", "--services", "all"]
