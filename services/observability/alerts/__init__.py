"""Built-in alerts (platform): pure rules over the folded log (rules.py), webhook delivery
(delivery.py), the service that raises, resolves and delivers them (service.py), `spz alerts`
(cli.py); the Prometheus rules for the same conditions are ../rules/skypurza.rules.yml."""
