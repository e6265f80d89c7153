"""The fleet simulator: `argosy profile`, `argosy sim`, `argosy plan` (docs/sim.md)."""
