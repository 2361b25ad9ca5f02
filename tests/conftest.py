"""Shared test set-up: telemetry off and offline before anything imports a heavy library."""

from __future__ import annotations

from rcgrpo.runtime import apply_defaults

apply_defaults()
