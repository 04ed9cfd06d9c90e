"""One scrape's page, encoded run by run (samples.Segment): a run whose input equals the one it
was built from at the previous scrape reuses that encoding instead of building and encoding its
families again.

Why: with 1,000 clusters the two summaries' families (cost rate by team/user/project/cluster,
spend by cluster, the label bounds folding them) are most of a scrape's own CPU, and between two
scrapes their answers are usually the same. The inputs are still asked of the projections at every
scrape, and compared whole (the answer itself, not a position that could lag it), so a scrape
never shows what a projection no longer says: there is no second source of truth, only the
previous encoding of the same answer.

The text format and OpenMetrics both are one block per family, so a page is the runs' blocks in
order; OpenMetrics' closing `# EOF` is written once, at the end.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.exposition import choose_encoder

from .samples import Segment

OPENMETRICS = "application/openmetrics-text"
EOF = b"# EOF\n"


class _Families:
    def __init__(self, items: list[Metric]) -> None:
        self.items = items

    def collect(self) -> list[Metric]:
        return self.items


def encode(items: list[Metric], accept: str | None) -> tuple[bytes, str]:
    """The families as the scraper asked (prometheus-client's encoders), for a whole page."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(items))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


class PageCache:
    """The last encoding of each cacheable run, per content type (one entry each: memory is one
    page's worth)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[Any, bytes]] = {}
        self.hits = 0
        self.misses = 0

    def page(self, runs: list[Segment], accept: str | None) -> tuple[bytes, str]:
        _, content_type = choose_encoder(accept or "")
        om = content_type.startswith(OPENMETRICS)
        parts = []
        for run in runs:
            slot = (run.name, content_type)
            last = self._last.get(slot)
            if run.key is not None and last is not None and last[0] == run.key:
                self.hits += 1
                parts.append(last[1])
                continue
            body, _ = encode(run.build(), accept)
            if om and body.endswith(EOF):
                body = body[: -len(EOF)]
            if run.key is not None:
                self.misses += 1
                self._last[slot] = (run.key, body)
            parts.append(body)
        return b"".join(parts) + (EOF if om else b""), content_type
