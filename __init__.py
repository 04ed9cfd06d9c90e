"""SkyPurza (spz): an open, event-sourced broker for AI compute that speaks SkyPilot's task standard."""

__version__ = "0.1.0"
