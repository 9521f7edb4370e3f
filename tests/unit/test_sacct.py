"""Parsing `sacct -P` text recorded from SLURM 22.05 on the local cluster (including step lines,
which must be ignored, array tasks, and 'CANCELLED by 0')."""

from __future__ import annotations

from pathlib import Path

from hpctrain.launch.slurm.sacct import parse_sacct

TEXT = (Path(__file__).resolve().parents[1] / "fixtures" / "sacct-22.05.txt").read_text()


def test_parse_recorded_sacct_output() -> None:
    states = parse_sacct(TEXT)
    assert sorted(states) == ["1026", "1027", "1028_0", "1028_1", "1028_2", "1029", "1229"]
    assert states["1026"].state == "COMPLETED" and states["1026"].done
    assert (
        states["1027"].state == "FAILED" and states["1027"].nodes == 2 and states["1027"].exit_code == "1:0"
    )
    assert states["1029"].state == "CANCELLED"  # "CANCELLED by 0" reduced to its first word
    assert states["1028_1"].nodelist == "n3"
    # more nodes than the partition has: SLURM accepts the job, which then waits for ever
    assert (states["1229"].state, states["1229"].reason) == ("PENDING", "PartitionConfig")


def test_a_pending_reason_is_explained_and_the_hopeless_ones_are_marked() -> None:
    from hpctrain.launch.slurm.sacct import explain_pending

    assert explain_pending("PartitionConfig") == (
        "PartitionConfig: the job asks for more than its partition has (nodes, CPUs or GPUs)",
        True,
    )
    assert explain_pending("PartitionNodeLimit")[1] and explain_pending("PartitionTimeLimit")[1]
    assert explain_pending("Resources") == ("Resources: waiting for nodes to become free", False)
    assert explain_pending("Priority")[1] is False
    assert explain_pending("SomethingNew") == ("SomethingNew", False)  # unknown: shown, waited on


def test_each_hopeless_reason_comes_with_its_own_fix() -> None:
    from hpctrain.launch.slurm.sacct import blocked_fix

    assert blocked_fix("DependencyNeverSatisfied").endswith("or start after them with :any")
    assert blocked_fix("PartitionConfig").startswith("change the request (cluster.partition, cluster.nodes")


def test_running_and_pending_are_not_done() -> None:
    states = parse_sacct(
        "7|x|RUNNING|1|00:00:03|0:0|n1|None\n8|x|PENDING|2|00:00:00|0:0|None assigned|Resources\n"
    )
    assert not states["7"].done and not states["8"].done


def test_garbage_lines_are_skipped() -> None:
    assert parse_sacct("sacct: error: something\n\n1|x|COMPLETED\n") == {}


def test_array_tasks_that_never_started_take_the_arrays_state() -> None:
    """Recorded on the local cluster: a 16-task array cancelled while pending has one record,
    `1152`, and none for `1152_0`; a partly started array lists its unsplit rest as `1153_[2-15%4]`."""
    from hpctrain.launch.slurm.sacct import with_array_tasks

    cancelled = parse_sacct("1152|submit|CANCELLED by 0|1|00:00:00|0:0|None assigned|None\n")
    states = with_array_tasks(["1152_0", "1152_15"], cancelled)
    assert states["1152_0"].state == "CANCELLED" and states["1152_0"].done
    assert states["1152_15"].job_id == "1152_15"
    partly = parse_sacct(
        "1153_0|x|RUNNING|1|00:00:09|0:0|n1|None\n"
        "1153_1|x|COMPLETED|1|00:00:05|0:0|n2|None\n"
        "1153_[2-15%4]|x|PENDING|1|00:00:00|0:0|None assigned|JobArrayTaskLimit\n"
    )
    states = with_array_tasks(["1153_0", "1153_1", "1153_7", "1153_16"], partly)
    assert [states[k].state for k in ("1153_0", "1153_1", "1153_7")] == ["RUNNING", "COMPLETED", "PENDING"]
    assert "1153_16" not in states  # not in the array's task list: still unknown
    # task 1 started first, on the array's own record; task 0's record has not reached slurmdbd
    # yet: the rest still names task 0, with task 1's state; task 0 has not run, let alone ended
    lagging = parse_sacct(
        "3492_1|x|COMPLETED|1|00:00:02|0:0|n2|None\n3492_[0]|x|COMPLETED|1|00:00:02|0:0|n2|None\n"
    )
    assert with_array_tasks(["3492_0", "3492_1"], lagging)["3492_0"].state == "PENDING"


def test_squeue_lines_are_live_jobs_with_the_pending_reason() -> None:
    """squeue -h -r --me -o '%i|%j|%T|%D|%M|%N|%r' as the local cluster printed it, plus a pending
    array task: live jobs keep their state and nodes, a pending one its reason."""
    from hpctrain.launch.slurm import sacct as s

    text = "1519|train|RUNNING|2|0:02|n[1-2]|None\n1153_8|sweep|PENDING|1|0:00||JobArrayTaskLimit\n"
    live = s.parse_squeue(text)
    assert (live["1519"].state, live["1519"].nodes, live["1519"].reason) == ("RUNNING", 2, "")
    assert (live["1153_8"].state, live["1153_8"].reason) == ("PENDING", "JobArrayTaskLimit")


def test_a_real_jobs_energy_record_reads_as_its_site_published_it() -> None:
    """A real job's accounting with an energy plugin: job 38113 on CSCS's santis (4 nodes, 1,152
    CPUs, 2,102 s, 2024-03-15), as published in jgphpc/dwdi slurm/README.md (commit af6d0f4), its
    values put in the field order hpctrain asks for. sacct printed ConsumedEnergy 20.54M and
    AllocTRES energy=20543125 for the job; its .batch step (one node) measured 5094129 J, and its
    .extern step repeats the whole job's energy, so summing the steps would count it twice."""
    from hpctrain.launch.slurm.sacct import parse_usage

    text = (
        "38113|2102|4|1152|20543125\n"
        "38113.batch|2102|1|288|5094129\n"  # without -X, steps are listed too: not the job's rows
        "38113.extern|2102|4|1152|20543125\n"
    )
    u = parse_usage(text, "38113")
    assert u is not None and u.incarnations == 1
    assert u.energy_j == 20543125  # J: sacct's 20.54M
    assert u.node_hours == 4 * 2102 / 3600 and u.core_hours == 1152 * 2102 / 3600
    # 20.54 MJ over 4 nodes for 35 min: 2.44 kW a node, a figure of power, not of a unit mix-up
    assert 2000 < u.energy_j / (4 * 2102) < 3000


def test_a_requeued_jobs_cost_sums_its_incarnations_and_energy_is_measured_or_none() -> None:
    from hpctrain.launch.slurm.sacct import parse_usage

    # `sacct -j 77 --duplicates -X -n -P -o JobID,ElapsedRaw,NNodes,AllocCPUS,ConsumedEnergyRaw`
    # of a job requeued once (SLURM keeps one row per incarnation), without an energy plugin
    text = "77|40|2|4|0\n77|125|2|4|0\n78|999|1|1|0\n"
    u = parse_usage(text, "77")
    assert u is not None and u.incarnations == 2
    assert u.node_hours == 2 * (40 + 125) / 3600 and u.core_hours == 4 * (40 + 125) / 3600
    assert u.energy_j is None  # 0 J means no plugin measured it: "not measured", never 0
    measured = parse_usage("9_1|3600|1|8|7200000\n", "9_1")
    assert measured is not None and measured.energy_j == 7.2e6 and measured.node_hours == 1.0
    assert parse_usage("", "77") is None and parse_usage("77|bad|2|4|\n", "77") is None


def test_scheduler_words_map_to_states_in_one_place() -> None:
    from hpctrain.records import State

    assert State.of("CANCELLED by 0") is State.CANCELLED and State.CANCELLED.done
    assert State.of("REQUEUED") is State.REQUEUED and not State.REQUEUED.done
    assert State.of("SOMETHING_NEW") is State.UNKNOWN and not State.UNKNOWN.done
    assert State.of("") is State.UNKNOWN and State.PENDING.live and not State.COMPLETED.live
    assert State.COMPLETED == "COMPLETED"  # a State is its word, in state.json and on screen
