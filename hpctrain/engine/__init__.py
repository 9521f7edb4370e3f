"""The engine axis: what averages the gradients across ranks.

    horovod   Horovod's DistributedOptimizer (ring-allreduce over MPI or Gloo; NCCL on GPUs)
    ddp       torch.distributed DistributedDataParallel (Gloo on CPUs, NCCL on GPUs)

An engine answers plan-time questions as class methods (its settings, rules, rank environment,
gradient grouping, collective) and, on the ranks, initialises from the launcher's environment,
wraps the model and optimizer, and reports how long each step waited for gradient communication
after its backward pass (the exposed communication). The training step (train/step.py) and loop
never ask which engine they have. Engines are registered by name in registry.py.
"""
