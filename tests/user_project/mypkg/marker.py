"""Settings the requeue test edits after submission: the job must keep running the snapshot."""

VERSION = "original"
LR = 0.05
