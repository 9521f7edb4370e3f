"""Tensor parallelism: each layer split over the ranks of the mesh's "tp" dimension (Megatron-LM's
column- and row-wise pairs, torch.distributed.tensor.parallel), parallelism.tp.*. One package owns
its whole life:

  figures    its record parts: a rank's collectives per step, their bytes and replayed seconds
  plan       which module is split how (pure: names only), the built-in models' own plans
  rules      its plan-time rules, each naming the key, the rule and the fix; its line in the plan
  split      the split on the ranks (and in the memory trace), and its checks on the model
  comm       the collectives of one warm-up step, counted, and replayed alone after training
  side       the rank side: split, count, replay (train/dims.py: LayerSplit)
  dimension  the dimension the house asks (parallel/dimensions.py)
  report     its rows of a run's summary (on the run's own allreduce curve) and its view of a study

Nothing outside this package imports it: the registry line names it."""
