"""Context parallelism: each sample's sequence split over the ranks of the mesh's "cp" dimension,
attention still seeing the whole sequence (parallelism.cp.degree). One package owns its whole life:

  settings   its parallelism.cp.* keys (the schema adds them: hpctrain/dimension_packages.py)
  figures    its record parts: the K/V bytes a step exchanges, and the seconds they take
  zigzag     which tokens a rank holds (pure): chunks i and 2N-1-i of 2N, so causal work balances
  rules      its plan-time rules, each naming the key, the rule and the fix
  attention  the exchange: all-gather of K/V on CPUs (Llama 3's), torch's ring attention on CUDA
  side       the rank side: splits the sequence where the model says, runs the steps' attention
             through the exchange, counts it, and times it again alone after training
  dimension  the dimension the house asks (parallel/dimensions.py)
  report     its row of a run's summary and its view of a study

Nothing outside this package imports it: the registry line names it."""
