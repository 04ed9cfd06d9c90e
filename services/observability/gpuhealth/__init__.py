"""The GPU health manager (platform): pure rules over node samples (rules.py), the service that
listens to samples and acts on findings (service.py), `spz health` (cli.py). docs/gpu-health.md."""
