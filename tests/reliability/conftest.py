"""The reliability tier: faults, hostile input and concurrent use (issue 9), against the real
launchers."""
