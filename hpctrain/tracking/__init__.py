"""Experiment tracking (MLflow, TensorBoard), written by the driver side from the run records."""
