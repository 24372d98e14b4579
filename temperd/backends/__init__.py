"""Backends that carry out a LayerPlan."""
