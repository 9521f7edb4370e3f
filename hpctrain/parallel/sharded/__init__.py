"""Sharded data parallelism (parallelism=fsdp | hsdp): FSDP2's fully_shard over the data-parallel
part of the device mesh. One package owns its plan and records:

  figures  its record part: the ranks one shard group spans
  rules    its plan-time rules, each naming the key, the rule and the fix (pure)
  kind     the parallelisms fsdp and hsdp: layout, rules, notes, tuning knobs, build

On the ranks it shards with the engine's Sharding capability (engine/fsdp_wrap.py), through the
trainer over the device mesh that data parallelism's split replicas share (train/mesh_trainer.py);
pipeline stages come through the shared mesh (parallel/mesh.py). Nothing outside this package
imports it but the parallelisms' registry and the packages' table (hpctrain/dimension_packages.py)."""
