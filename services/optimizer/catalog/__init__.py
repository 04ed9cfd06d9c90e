"""AWS catalog: instance types, offerings per region and zone, prices in micro-dollars per hour."""

from .loader import SHIPPED_FILE, load_catalog, save_catalog, shipped_catalog
from .model import (
    Catalog,
    InstanceType,
    Offering,
    ZoneOffer,
    dollars_to_micros,
    format_dollars,
    micros_to_dollars,
)

__all__ = [
    "SHIPPED_FILE", "Catalog", "InstanceType", "Offering", "ZoneOffer", "dollars_to_micros",
    "format_dollars", "load_catalog", "micros_to_dollars", "save_catalog", "shipped_catalog",
]
