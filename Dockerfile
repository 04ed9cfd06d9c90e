# One image for every SkyPurza service; compose.yaml picks the service with `spz api serve --services`.
FROM python:3.11-slim
WORKDIR /opt/skypurza
COPY pyproject.toml README.md ./
COPY __init__.py ./
COPY events ./events
COPY services ./services
COPY cli ./cli
RUN pip install --no-cache-dir . && useradd --create-home --uid 1000 skypurza
USER skypurza
ENV SKYPURZA_HOME=/home/skypurza/.skypurza
ENTRYPOINT ["spz"]
CMD ["api", "serve", "--services", "all"]
