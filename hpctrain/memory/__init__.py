"""Memory known before the queue: each rank's peak predicted from the model itself, without
allocating it (trace.py), the process's own cost measured once per host (fixed.py), and the
refusal of a point that cannot fit, with the change that would (predict.py)."""
