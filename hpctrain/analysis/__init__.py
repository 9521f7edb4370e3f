"""Scaling analysis: pure formulas (metrics, model), collection of run records, report, plots."""
