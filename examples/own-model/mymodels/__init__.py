"""Your code: hpctrain imports it by the `_target_` paths in the command line."""
