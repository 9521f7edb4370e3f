"""Launch backends: the only modules that start processes."""
