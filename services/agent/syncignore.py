"""The `.skyignore` / `.gitignore` rules of a synced directory: `skypurza.events.syncignore`.

They moved to events/ because the CLI packs workdirs by the same rules (events/workdir_archive.py);
this name stays for the agent's code and the tests that import it here.
"""

from __future__ import annotations

from skypurza.events.syncignore import GITIGNORE, MAX_IGNORE_BYTES, SKYIGNORE, ignore_for

__all__ = ["GITIGNORE", "MAX_IGNORE_BYTES", "SKYIGNORE", "ignore_for"]
