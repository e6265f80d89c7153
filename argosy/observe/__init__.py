"""Observability: metrics naming (docs/metrics.md), the live dashboard (/dashboard), traces and logs."""
