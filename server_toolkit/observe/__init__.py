"""Watching a run: the live dashboard, Prometheus metrics and experiment tracking (docs/observability.md)."""
