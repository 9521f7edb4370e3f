"""Pipeline parallelism, one package for its whole life (issue 73): nothing outside it imports its
modules but the parallelism registry (by name: kind.py's classes), its line in
hpctrain/dimension_packages.py (its dimension, records, rows and study view, by module name),
the shared mesh (parallel/mesh.py, for a sharded layout with stages) and its benchmark. Its modules, top to bottom (the import
contract in pyproject.toml keeps this order):

  kind.py        parallelism=pipeline | hybrid: layout, notes, summary parts, study and tune
                 settings, and which trainer the ranks build (plan time)
  setup.py       a rank's pipeline trainer over traced pieces (pipeline | hybrid)
  mesh.py        ... over real modules on a device mesh, split by TP and sharded by FSDP2
  step.py        one pipeline step: the schedule, the replicas' average, its figures
  pipe.py        the cut, the process groups, the schedule's stages, the stages' state
  p2p.py         the link between stages: its alpha-beta, and the waits split into transfer and idle
  rules.py, mesh_rules.py
                 the plan-time rules: stages, micro-batches, schedules, split points
  dimension.py   the stages as a dimension of any layout: "pp", its setting, its summary part

  report.py      its analysis: the summary table's rows and advice, the pipeline roofline, the
                 theory with the stages as measured, the step at other micro-batch counts, and its
                 view of a study (columns, bars, idle term, section: analysis/study_parts.py)
  figures.py     its records: PipelineStep, PipelineRank, PipelineFigures (records/parts.py reads
                 them by name)

The pipeline's benchmark (bench/pipeline.py, `hpctrain bench pipeline`) is a command, above this
package's layer: it reads report.py, the one door left open (tests/unit/test_house.py)."""
