"""Data parallelism (parallelism=data): the whole model on every rank, its gradients averaged by
the engine (kind.py); with a layer split (tensor parallelism) or a named dimension, replicas of the
split model over the device mesh. Its rank side is the shared data-parallel trainer
(train/setup.py: data_parallel_trainer, train/step.py) and the engine's wrap. Nothing outside this
package imports it but the parallelisms' registry."""
