"""Whether a task fits a cluster that already exists: `spz launch -c NAME` and `spz exec NAME`.

The check is `skypurza.events.clusterfit` (one copy, shared with the API server's
`POST /api/v1/clusters/{name}/jobs`); this module keeps the CLI's import of it working.
"""

from __future__ import annotations

from skypurza.events.clusterfit import ClusterShape, FitShape, Misfit, misfit

__all__ = ["ClusterShape", "FitShape", "Misfit", "misfit"]
