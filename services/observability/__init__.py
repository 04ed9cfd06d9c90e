"""Observability (platform): Prometheus metrics computed from the projections and the live log
(docs/observability.md); GPU sampling and health live in `gpuhealth/`."""
