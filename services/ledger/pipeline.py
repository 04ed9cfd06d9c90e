"""The ledger's file through the shared projection pipeline (events/projection/pipeline.py):
batches applied while the previous one commits, a failing event bisected out and parked."""

from __future__ import annotations

from pathlib import Path

from skypurza.events.projection import pipeline as pp
from skypurza.events.projection.pipeline import Failed, Pipeline, apply_isolating, project

from .store import PROJECTION

__all__ = ["Failed", "Pipeline", "Projector", "apply_isolating", "project"]


class Projector(pp.Projector):
    """The ledger's projections file, its state, and the one connection that writes it."""

    def __init__(self, path: Path | str):
        super().__init__(path, PROJECTION)
