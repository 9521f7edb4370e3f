"""A cluster behind SSH (`cluster.remote=user@login`): the commands a user types on their laptop run
the cluster's own hpctrain over one multiplexed SSH connection. ssh.py: the connection (its
argv, pure; what a failure means); bundle.py: the code and configs that travel, by content hash;
there.py: the cluster's hpctrain (its version, a command run attached or detached, records fetched);
forward.py: which commands go there, their words, and their record here (remote.json)."""

# the commands that plan work (their words before the overrides), and those that take a directory
PLANNED = {"run": 1, "study": 2, "tune": 1}
ON_RECORDS = ("status", "logs", "cancel", "analyze")
