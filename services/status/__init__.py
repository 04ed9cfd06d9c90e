"""The status service (open): the projections `spz status`, `spz queue` and `spz jobs queue` read."""
