"""Runs as job steps of one held allocation, as `salloc` then `srun` do by hand: `hpctrain tune`
on SLURM waits in the queue once, then starts every trial at once on the same nodes.

The allocation is a batch job that only waits (its script loops until a release file appears,
so it ends COMPLETED when the tune is done, and is cancelled as a fallback). Each run in it is
an ordinary planned SLURM run (run directory, plan.json, submitit's folder and pickle) started
by `srun --jobid=ALLOC` from the submitting host instead of by sbatch: its job id is the step's
("ALLOC.STEP"), which sacct reports and scancel stops, and its rank logs are named as a batch
run's are (`ALLOC.STEP_<rank>_log.out`), so status, logs, cancel and failure attribution work on
it unchanged. A step has no batch-script teardown: no restarts in place and no pre-flight
resubmission (the launcher refuses neither; a tune's trials are short probes without them).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from submitit.core.utils import DelayedSubmission

from hpctrain import records
from hpctrain.errors import LaunchError, RunCancelled
from hpctrain.launch.base import Job, RunSpec
from hpctrain.launch.rundir import prepare_run_dir, write_run_files
from hpctrain.launch.slurm.job import TrainingJob
from hpctrain.launch.slurm.nodes import fields, job_state, scontrol
from hpctrain.launch.slurm.plan import SUBMIT_MODULE, SlurmPlan
from hpctrain.launch.slurm.sacct import blocked_fix, explain_pending
from hpctrain.launch.slurm.scheduler import NOT_SUBMITTED, ask, query
from hpctrain.records import State

RELEASE = "release"  # in the allocation's directory: the holding script ends when it appears
HEARTBEAT = "heartbeat"  # beside it: touched every BEAT_S by the command that holds it
BEAT_S = 10.0
STALE_S = 180  # a heartbeat this old ends the holding script (clocks of login and compute nodes differ)
STEP_ERR = "srun.err"  # in a step's submitit folder: srun's own report (which task died, how)
POLL_S = 1.0
# while a step starts, the controller is asked this often; its rank logs are looked for in between
ASK_EVERY_S = 4.0
PENDING_MAX_S = 10.0  # a pending allocation is asked after 1 s, then less and less often, up to this
GONE_S = 300.0  # how long a resumed tune waits for an earlier allocation's ranks to be killed


def _header(executor: dict[str, Any], name: str, time_min: int, folder: Path) -> list[str]:
    """submitit's #SBATCH header for the runs' parameters (their nodes, tasks, CPUs, GPUs,
    partition, account, exclusions...) under its own name and time, without the time-limit
    signal (nothing in it checkpoints). Pure."""
    from submitit.slurm.slurm import _make_sbatch_string

    params = {**executor, "job_name": name, "time": time_min, "setup": []}
    params.pop("teardown", None)
    text = _make_sbatch_string(command="true", folder=str(folder), **params)
    return [
        line
        for line in text.split("\n# setup")[0].split("\n# command")[0].splitlines()
        if not line.startswith(("#SBATCH --signal", "#SBATCH --wckey"))
    ]


def hold_script(executor: dict[str, Any], name: str, time_min: int, release: Path) -> str:
    """The allocation's batch script: the runs' header, then a loop that waits until the release
    file appears, or until the heartbeat beside it is older than STALE_S (the command that holds
    the allocation was killed with SIGKILL, or its host lost: nobody will start a step). Pure."""
    beat = shlex.quote(str(release.parent / HEARTBEAT))
    wait = (
        f"while [ ! -e {shlex.quote(str(release))} ]; do "
        f"[ $(( $(date +%s) - $(stat -c %Y {beat} 2>/dev/null || echo 0) )) -lt {STALE_S} ] || exit 0; "
        "sleep 1; done"
    )
    head = _header(executor, name, time_min, release.parent)
    return "\n".join(
        [*head, "", "# hold the nodes for job steps started by srun --jobid (hpctrain)", wait, ""]
    )


class Heartbeat:
    """The holding command's pulse: touches `home`/HEARTBEAT every BEAT_S from a daemon thread
    while the allocation is held, which the holding script reads (hold_script)."""

    def __init__(self, home: Path) -> None:
        self.path, self.stop = home / HEARTBEAT, threading.Event()
        self.path.touch()
        self.thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stop.wait(BEAT_S):
            try:
                self.path.touch()
            except OSError:  # a full or vanished directory: the script's own limit still ends it
                pass

    def end(self) -> None:
        self.stop.set()


def driver_script(executor: dict[str, Any], name: str, time_min: int, home: Path, command: list[str]) -> str:
    """A batch script that holds the runs' nodes and runs `command` on the first of them (the
    plan's setup lines first): hpctrain itself, starting the runs as job steps of this job. Pure."""
    head = _header(executor, name, time_min, home)
    setup = [str(line) for line in executor.get("setup", [])]
    return "\n".join(
        [*head, "", "# hpctrain starts the runs as job steps of this job (srun --jobid)", *setup,
         f"exec {shlex.join(command)}", ""]
    )  # fmt: skip


def step_command(plan: SlurmPlan, alloc_id: str, name: str) -> str:
    """The shell command that starts the run as a step of `alloc_id`: the plan's setup lines
    (its exports among them), then srun with the plan's shape and srun arguments, logging as
    a batch run does (%j.%s: the step's own id). Pure."""
    ex = plan.executor
    shape = [f"--nodes={ex['nodes']}", f"--ntasks-per-node={ex['ntasks_per_node']}"]
    shape.append(f"--cpus-per-task={ex['cpus_per_task']}")
    if ex.get("gpus_per_node"):
        shape.append(f"--gpus-per-node={ex['gpus_per_node']}")
    logs = Path(plan.folder) / "%j.%s_%t_log"
    srun = [
        "srun", f"--jobid={alloc_id}", f"--job-name={name}", *shape, "--unbuffered",
        "--output", f"{logs}.out", "--error", f"{logs}.err",
        *[str(a) for a in ex.get("srun_args", [])],
    ]  # fmt: skip
    run = f"{plan.python} -u -m {SUBMIT_MODULE} {shlex.quote(plan.folder)}"
    setup = [str(line) for line in ex.get("setup", [])]
    return "\n".join(["set -e", *setup, "export SUBMITIT_EXECUTOR=slurm", f"exec {shlex.join(srun)} {run}"])


def clean_env(env: dict[str, str]) -> dict[str, str]:
    """The submitting host's environment without the SLURM_* variables of an allocation it may
    itself run in (srun would read them as the step's), SLURM_CONF kept."""
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def logged_step(names: set[str], alloc_id: str) -> str | None:
    """The step id in the name of a rank log of a step of `alloc_id` (`ALLOC.STEP_<rank>_log.out`,
    step_command's names: slurmstepd creates them as the step starts), else None. Pure."""
    for name in sorted(names):
        sid, _, rest = name.partition("_")
        if (
            sid.startswith(f"{alloc_id}.")
            and sid[len(alloc_id) + 1 :].isdigit()
            and rest.endswith("_log.out")
        ):
            return sid
    return None


def step_id(squeue_steps: str, alloc_id: str, name: str) -> str | None:
    """From `squeue -h -s -j ALLOC -o %i|%j`: the id of the step named `name`. Pure."""
    for line in squeue_steps.splitlines():
        sid, _, sname = line.strip().partition("|")
        if sname == name and sid.startswith(f"{alloc_id}."):
            return sid
    return None


@dataclass
class Allocation:
    """A held allocation: its job id and its directory (job.json, the script, its log)."""

    job_id: str
    home: Path
    heartbeat: Heartbeat | None = None  # the holding command's (None: driven from inside)

    def state(self) -> State:
        return job_state(self.job_id)

    def start(self, run: RunSpec[SlurmPlan], timeout_s: float = 120) -> Job:
        """Write the run's files and start it as a step; its job.json names the step."""
        plan = run.plan
        write_run_files(prepare_run_dir(run.run_dir), run.cfg, plan)
        folder = Path(plan.folder)
        folder.mkdir(parents=True, exist_ok=True)
        DelayedSubmission(TrainingJob(plan.run_dir)).dump(folder / f"{self.job_id}_submitted.pkl")
        name = f"hpctrain-{run.run_dir.name}"
        before = {p.name for p in folder.iterdir()}  # a retried run's folder holds its earlier steps' logs
        err = (folder / STEP_ERR).open("ab")
        with err:
            proc = subprocess.Popen(
                ["bash", "-c", step_command(plan, self.job_id, name)],
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=clean_env(dict(os.environ)),
            )  # fmt: skip
        sid = self._step_of(proc, name, folder, before, timeout_s)
        ref = records.new(
            records.JobRef, launcher="slurm", job_id=sid, world_size=plan.world_size, folder=plan.folder
        )
        records.write(run.run_dir / records.JOB, ref, indent=None)
        return Job(run.run_dir, ref)

    def _step_of(
        self, proc: subprocess.Popen[bytes], name: str, folder: Path, before: set[str], timeout_s: float
    ) -> str:
        """The step's id once its rank logs appear in `folder` (no query) or the controller lists
        it; a LaunchError with srun's words if srun ends first or the step never appears."""
        start = time.monotonic()
        deadline, asked = start + timeout_s, start
        while time.monotonic() < deadline:
            ended = proc.poll() is not None  # asked first: a step leaves the queue only after its srun
            found = logged_step({p.name for p in folder.iterdir()} - before, self.job_id)
            if found is None and (ended or time.monotonic() - asked >= ASK_EVERY_S):
                asked = time.monotonic()
                text = query(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i|%j"]) or ""
                found = step_id(text, self.job_id, name)
            if found is None and ended:  # a short step may have left the queue already: accounting has it
                text = query(["sacct", "-P", "-n", "-o", "JobID,JobName", "-j", self.job_id]) or ""
                found = step_id(text, self.job_id, name)
            if found is not None:
                return found
            if ended:
                state = self._settled_state()
                if state == State.CANCELLED:  # hpctrain cancel, or scancel: the user's doing, not srun's
                    raise RunCancelled(
                        f"allocation {self.job_id} was cancelled; what it had not run yet was not started"
                    )
                said = (folder / STEP_ERR).read_text(errors="replace").strip()[-2000:]
                raise LaunchError(
                    f"srun could not start a step in allocation {self.job_id} ({state}): "
                    f"{said or f'exit status {proc.returncode}'}"
                )
            time.sleep(POLL_S / 4)
        proc.kill()
        raise LaunchError(
            f"the step {name} did not appear in allocation {self.job_id} within {timeout_s:g} s"
        )

    def _settled_state(self, wait_s: float = 30) -> State:
        """The allocation's state once it has left COMPLETING (a cancel shows as COMPLETING first,
        and only then as CANCELLED), or as it is after `wait_s`."""
        state, deadline = self.state(), time.monotonic() + wait_s
        while state == State.COMPLETING and time.monotonic() < deadline:
            time.sleep(POLL_S / 4)
            state = self.state()
        return state

    def release(self, wait_s: float = 30) -> None:
        """End the allocation: the release file, then scancel if it is still there after `wait_s`
        (at once if it is not running: no holding loop reads the file)."""
        records.write_atomic(self.home / RELEASE, "")
        if self.heartbeat is not None:
            self.heartbeat.end()
        deadline = time.monotonic() + (wait_s if self.state() == State.RUNNING else 0.0)
        while time.monotonic() < deadline:
            time.sleep(POLL_S)  # the holding loop looks every second
            if self.state() not in (State.RUNNING, State.PENDING, State.UNKNOWN):
                return
        query(["scancel", self.job_id], timeout_s=60)


def _end_earlier(home: Path, say: Callable[[str], None], timeout_s: float = GONE_S) -> None:
    """An earlier allocation of `home` still in the queue (its tune was killed, then resumed)
    holds nodes nobody will use: cancelled. Then, cancelled now or before, it must have left the
    queue: until SLURM has killed its steps' ranks (they ignore SIGTERM, so KillWait later), they
    still write into the trials' directories that the resumed tune is about to set aside."""
    try:
        earlier = records.read(home / records.JOB, records.JobRef).job_id
    except records.RecordError:
        return
    state = job_state(earlier)  # UNKNOWN: the controller no longer knows it
    if not state.done and state != State.UNKNOWN:  # running, pending, suspended, held...
        query(["scancel", earlier], timeout_s=60)
        say(f"allocation {earlier}, left by an earlier invocation, cancelled")
    deadline = time.monotonic() + timeout_s
    while query(["squeue", "-h", "-j", earlier, "-o", "%T"]):  # None or "": no longer listed
        if time.monotonic() > deadline:
            raise LaunchError(
                f"allocation {earlier}, left by an earlier invocation, is still ending after "
                f"{timeout_s:g} s (squeue -j {earlier}); resume when it has left the queue"
            )
        time.sleep(POLL_S)


def inside(home: Path, environ: dict[str, str]) -> Allocation | None:
    """The allocation recorded in `home` when this process runs inside it (the job that drives a
    study in one allocation: driver_script), else None."""
    try:
        recorded = records.read(home / records.JOB, records.JobRef).job_id
    except records.RecordError:
        return None
    return Allocation(recorded, home) if environ.get("SLURM_JOB_ID") == recorded else None


def _submitted(plan: SlurmPlan, home: Path, script: Path, text: str, what: str) -> Job:
    """Write `script` and sbatch it; its job.json in `home` (status, logs and cancel find it)."""
    home.mkdir(parents=True, exist_ok=True)
    records.write_atomic(script, text)
    r = ask(["sbatch", "--parsable", str(script)], patience_s=60, again=NOT_SUBMITTED)
    if not r.ok:
        raise LaunchError(f"sbatch could not submit {what}: {r.why()}")
    ref = records.new(records.JobRef, launcher="slurm", job_id=r.out.strip().split(";")[0], world_size=plan.world_size, folder=str(home))  # fmt: skip
    records.write(home / records.JOB, ref, indent=None)
    return Job(home, ref)


def submit_driver(plan: SlurmPlan, home: Path, name: str, time_min: int, command: list[str]) -> Job:
    """Submit driver_script for runs of `plan`'s shape (`inside` finds it from within)."""
    text = driver_script(plan.executor, name, time_min, home, command)
    return _submitted(plan, home, home / "driver.sbatch", text, "the study's job")


def hold(
    plan: SlurmPlan, home: Path, name: str, time_min: int, say: Callable[[str], None], timeout_s: float
) -> Allocation:
    """Submit the allocation for runs of `plan`'s shape and wait until it runs; its job.json in
    `home` lets status and cancel find it. LaunchError if it ends or is still waiting at
    `timeout_s` (then cancelled), with the controller's reason."""
    home.mkdir(parents=True, exist_ok=True)
    _end_earlier(home, say)
    (home / RELEASE).unlink(missing_ok=True)  # an earlier allocation's (a resumed tune)
    text = hold_script(plan.executor, name, time_min, home / RELEASE)
    beat = Heartbeat(home)
    try:
        alloc = Allocation(
            _submitted(plan, home, home / "hold.sbatch", text, "the allocation").job_id, home, beat
        )
    except BaseException:
        beat.end()
        raise
    say(
        f"allocation {alloc.job_id}: {plan.nodes} node(s) x {plan.ranks_per_node} rank(s) for every run "
        f"(released when this command ends; scancel {alloc.job_id} if it cannot)"
    )
    try:
        _wait_running(alloc, timeout_s, say)
    except BaseException:  # Ctrl-C, SIGTERM, SIGHUP (KeyboardInterrupt) or an error: nothing left queued
        beat.end()
        query(["scancel", alloc.job_id], timeout_s=60)
        raise
    return alloc


def _wait_running(alloc: Allocation, timeout_s: float, say: Callable[[str], None]) -> None:
    """Until `alloc` runs; LaunchError, with the controller's reason, if it ends first, if SLURM
    says it can never start (a limit of the partition, a node it cannot have), or at `timeout_s`."""
    deadline, said, wait = time.monotonic() + timeout_s, "", POLL_S
    while True:
        job = fields(scontrol("show", "job", "-o", alloc.job_id))  # its state and reason, one call
        state, why = State.of(job.get("JobState", "")), job.get("Reason", "")
        if state == State.RUNNING:
            return
        if state not in (State.PENDING, State.UNKNOWN) or time.monotonic() > deadline:
            raise LaunchError(f"allocation {alloc.job_id} did not start ({state}, reason {why or 'none'})")
        text, never = explain_pending(why)
        if never:  # as a job's: sbatch would have refused it, the controller queued it instead
            raise LaunchError(
                f"allocation {alloc.job_id} can never start ({text}): cancelled; {blocked_fix(why)}"
            )
        if why and why != said and why != "None":
            say(f"allocation {alloc.job_id} pending: {text}")
            said = why
        time.sleep(wait)
        wait = min(wait * 1.5, PENDING_MAX_S)  # a busy cluster's allocation may wait for hours
