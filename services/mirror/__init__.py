"""The public CloudEvents mirror: job events republished for outsiders (docs/events.md)."""
