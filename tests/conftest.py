"""Shared fixtures. Snapshots are refreshed only on request: pytest --update-snapshots."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = Path(__file__).parent / "snapshots"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-snapshots",
        action="store_true",
        help="rewrite tests/snapshots/* from the current output instead of comparing",
    )


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist's workers are handed COLUMNS=80 LINES=24; the tests see the environment a
    # plain pytest run has (the terminal-output tests depend on it)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for var in ("COLUMNS", "LINES"):
            os.environ.pop(var, None)
    # The suite runs more ranks than this host has cores (the test cluster's 4 nodes share them,
    # beside local runs): Open MPI yields the core while it waits instead of spinning on it, as
    # hpctrain's own mpirun plan asks when ranks outnumber cores. Runs and jobs inherit it.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    # Likewise OpenMP: torch's threads (two in a one-rank run here, and in these test processes)
    # spin after each parallel region by default, so every wait between kernels (a collective,
    # the data, a sleep) burnt a core the other stream could use: PASSIVE sleeps at once (a
    # 400-step loop waiting 1 ms a step took 1.44 CPU-s spinning, 0.6 s passive, same wall time)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # A suite started in the background by a non-interactive shell (`... &`) inherits SIGINT
    # ignored, and so would every CLI it starts (Python then installs no Ctrl-C handler): the
    # tests that press Ctrl-C on a run would see it ignored. They emulate a terminal: default it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Two streams side by side (scripts/test.sh runs pytest-xdist with --dist loadgroup): the
    SLURM tests share the one local cluster and run one after another on one worker, the local
    mpirun tests one after another on the other, and the unit tests wherever there is room. The
    SLURM stream mostly waits (queueing, requeues, time limits, accounting), so the other stream
    has the cores while it does; no two local trainings ever compete with each other (a third
    worker running local tests two at a time made each take twice as long and the suite no
    faster: a fresh clone's local tests summed 2344 s against 1113 s; a third running only the
    unit tests beside the two streams made the first session 1186 s long against 1098 s). Local
    tests that mostly wait (stall timeouts, hung user code) are marked side_stream: run alone
    they join the SLURM stream; scripts/test.sh runs them in its second session instead, beside
    its SLURM 24.11 tests, which mostly wait on their scheduler too."""
    # the container tests last in their streams: the image builds in the background meanwhile
    items.sort(key=lambda item: item.get_closest_marker("container") is not None)
    _one_slurm_version(config, items)
    _gpus_needed(items)
    for item in items:
        if item.get_closest_marker("slurm") or item.get_closest_marker("side_stream"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.get_closest_marker("mpi"):
            item.add_marker(pytest.mark.xdist_group("local"))


def _one_slurm_version(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A session talks to one SLURM version (SLURM_VERSION; its clients on PATH, its SLURM_CONF):
    22.05's runs every SLURM test but those marked slurm_second; another version's (scripts/
    test.sh's second session, beside the first) only those marked slurm_versions or slurm_second,
    and of the local tests those its -m selects (side_stream)."""
    second = SLURM_VERSION != "22.05"

    def kept(item: pytest.Item) -> bool:
        mark = item.get_closest_marker
        if not mark("slurm"):  # a local case of a test marked for both versions runs once, in the first
            # session, or in the second where it is side_stream (where -m selects it)
            return (
                not second
                or bool(mark("side_stream"))
                or not (mark("slurm_versions") or mark("slurm_second"))
            )
        return bool(mark("slurm_versions") or mark("slurm_second")) if second else not mark("slurm_second")

    dropped = [item for item in items if not kept(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if kept(item)]


@pytest.fixture
def snapshot(request: pytest.FixtureRequest):
    """snapshot(name, text): compare text with tests/snapshots/name (or rewrite it on request)."""
    update = request.config.getoption("--update-snapshots")

    def check(name: str, text: str) -> None:
        path = SNAPSHOTS / name
        if update:
            path.write_text(text)
            return
        assert path.exists(), f"no snapshot {path}; create it with: pytest --update-snapshots"
        expected = path.read_text()
        assert text == expected, (
            f"{name} differs from the recorded snapshot; if the change is "
            "intended, refresh it with: pytest --update-snapshots"
        )

    return check


def _gpus_needed(items: list[pytest.Item]) -> None:
    """Tests marked gpu (gpu(n): n GPUs) that this machine cannot run are listed as not run, with
    the count they need. The GPU tier (scripts/test.sh --gpu) selects them; every other run
    deselects them (-m "not gpu"), so CI never counts them as skipped."""
    marked = [(item, item.get_closest_marker("gpu")) for item in items]
    wanted = [(item, int(m.args[0]) if m.args else 1) for item, m in marked if m is not None]
    if not wanted:
        return
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item, need in wanted:
        if have < need:
            item.add_marker(
                pytest.mark.skip(reason=f"{item.name} needs {need} GPU(s); this machine has {have}")
            )


# Commands a test runs through hpctrain.cli.main in its own process (hpctrain_here): the same code,
# output and exit status, without a new interpreter's ~0.7 CPU-s of imports (a tenth of the CPU
# of tests/mpi/test_engines.py and test_tensor.py together, measured). `bench submit` changes PATH
# and `container build` may take many minutes: each keeps a process of its own, as does whatever a
# test must signal or time out (start_hpctrain, own_process=True).
IN_PROCESS = frozenset(
    {"run", "status", "logs", "analyze", "cancel", "study", "track", "preflight", "bench", "tune"}
)
OWN_PROCESS = (["bench", "submit"],)


def hpctrain(
    *args: str, timeout: float = 600, cwd: Path | None = None, own_process: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI (no progress bar; output captured); in a subprocess unless IN_PROCESS
    says otherwise, whose limit is then pytest-timeout's, not `timeout`."""
    if args and args[0] in IN_PROCESS and list(args[:2]) not in OWN_PROCESS and not own_process:
        return hpctrain_here(*args, cwd=cwd)
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env,
    )


def hpctrain_here(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI's own entry point (hpctrain.cli.main) in this process, output captured: the same
    code as the `hpctrain` command, exit statuses and messages as the command gives them, without
    a new interpreter importing hpctrain, Hydra and numpy (~0.7 CPU-s each). For validation, dry
    runs, bad arguments, records that do not read, and runs that must succeed (run_ok): the
    ranks still start under the run's own supervisor and launcher. What a test signals, kills or
    times out goes through `hpctrain` (a subprocess)."""
    import io
    import signal

    from hpctrain.cli import main

    fresh_slurm_door()
    out, err = io.StringIO(), io.StringIO()
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}  # main() sets them
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "200"
    try:
        with contextlib.chdir(cwd or ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse: --help, --version, bad arguments
                code = e.code if isinstance(e.code, int) else 1
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    return subprocess.CompletedProcess(["hpctrain", *args], code, out.getvalue(), err.getvalue())


def fresh_slurm_door() -> None:
    """A new command's door to SLURM (launch/slurm/scheduler.py: its counts, its burst and rate),
    as a new process has. The CLI run in this process and the tests that launch in it (Hydra's
    launcher suite) would otherwise share one bucket for a whole stream: some 190 SLURM tests at
    30 queries a minute after the first 30, every query beyond that waiting (fresh clones: the
    SLURM stream 200 s longer). Nothing is imported for a test that has not touched SLURM."""
    scheduler = sys.modules.get("hpctrain.launch.slurm.scheduler")
    if scheduler is not None:
        scheduler.SCHEDULER = scheduler.Scheduler()


@pytest.fixture(autouse=True)
def _a_fresh_slurm_door_per_test() -> None:
    fresh_slurm_door()


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture(autouse=True)
def _cancel_the_jobs_of_a_failed_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A SLURM test that fails (a deadline, pytest's timeout) cancels the jobs it left in the
    queue, those whose batch script lies under its tmp_path: CI saw one left running hold its
    nodes, and the five tests after it failed waiting for them."""
    yield
    tmp = request.node.funcargs.get("tmp_path") if isinstance(request.node, pytest.Function) else None
    if (
        not request.node.stash.get(FAILED, False)
        or request.node.get_closest_marker("slurm") is None
        or tmp is None
    ):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        queue = subprocess.run(["squeue", "-h", "-o", "%A|%o"], capture_output=True, text=True, timeout=60)
        left = [job for job, _, script in (line.partition("|") for line in queue.stdout.splitlines())
                if script.startswith(f"{tmp}/")]  # fmt: skip
        if left:
            subprocess.run(["scancel", *left], capture_output=True, timeout=60)
            print(f"\nthe failed test's jobs left in the queue were cancelled: {' '.join(left)}")


def run_ok(tmp: Path, name: str, *overrides: str, cwd: Path | None = None) -> tuple[Path, dict]:
    """`hpctrain run` into tmp/name, which must succeed; the run directory and its summary."""
    run_dir = tmp / name
    r = hpctrain("run", "--no-progress", f"run.dir={run_dir}", *overrides, cwd=cwd)
    assert r.returncode == 0, (
        f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}{batch_words(run_dir)}"
    )
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def batch_words(run_dir: Path) -> str:
    """What a SLURM run's batch script and its teardown said (srun's and hpctrain's lines in rank
    0's error log), for a failed test's message: CI keeps no run directory."""
    said = [
        f"{log.name}: {line}"
        for log in sorted((run_dir / "submitit").glob("*_0_log.err"))
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith(("hpctrain:", "srun:", "slurmstepd"))
    ]
    return "\nthe batch script said:\n" + "\n".join(said[-30:]) if said else ""


# Real data (scikit-learn's digits), fp32, no shuffle surprises: a deterministic small run.
DIGITS_CNN = ["data=digits", "model=cnn", "train.steps=12", "train.warmup_steps=2", "train.log_interval=4"]


def weights(run_dir: Path) -> dict[str, Any]:
    import torch

    return torch.load(run_dir / "model.pt", map_location="cpu")


def assert_resumes_on_one_rank(tmp: Path, saved: Path, reference: Path, *model: str) -> str:
    """`saved` (a checkpoint at step 4) resumed on one rank under Horovod with the whole batch of
    32 ends on `reference`'s weights; what the run printed."""
    one = tmp / "one"
    r = hpctrain(
        "run", "--no-progress", f"run.dir={one}", *model, "cluster.ranks=1", "train.batch_per_rank=32",
        "parallelism.engine=horovod", f"train.resume_from={saved}",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "at step 4" in r.stdout, r.stdout
    assert_same_weights(reference, one, rtol=1e-5, atol=1e-6)
    return r.stdout


def assert_same_weights(a: Path, b: Path, rtol: float, atol: float) -> None:
    import torch

    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")


def steps_of(run_dir: Path, rank: int) -> list[dict]:
    """A rank's step lines, each with its parts' figures also under their flat names (flat)."""
    from hpctrain.records import StepRecord

    lines = (run_dir / f"steps-rank{rank}.jsonl").read_text().splitlines()
    return [flat(json.loads(line), StepRecord) for line in lines]


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The reference run many tests compare against: 2 ranks x 16 samples, Horovod over MPI,
    fp32. Run once per session (it only is read)."""
    return run_ok(
        tmp_path_factory.mktemp("ref"), "ref", *DIGITS_CNN, "cluster.ranks=2", "train.batch_per_rank=16"
    )


@pytest.fixture(scope="session")
def one_rank_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The same global batch of 32 on one rank: what every data-parallel run must equal."""
    return run_ok(
        tmp_path_factory.mktemp("one"), "one", *DIGITS_CNN, "cluster.ranks=1", "train.batch_per_rank=32"
    )


@pytest.fixture(scope="session")
def strong_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished local strong-scaling study (1 and 2 ranks, 2 repetitions each, the allreduce
    benchmark, the report) and what `hpctrain study` printed: tests/mpi/test_study.py checks it
    and resumes it, the reader fuzz damages copies of it. Run once per session."""
    root = tmp_path_factory.mktemp("study")
    r = hpctrain(
        "study",
        "strong",
        "--no-progress",
        "study.ranks=[1,2]",
        "study.repetitions=2",
        "study.steps=8",
        "study.warmup_steps=2",
        "study.global_batch=32",
        "study.allreduce_max_mb=1",
        "data=digits",
        f"run.output_root={root}",
        "run.name=st",
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    [study] = list(root.glob("*/*-st-strong"))
    return study, r.stdout


# an MLP of 4 hidden blocks on the digits: pipelines cut it between blocks 2 and 3 (net.3)
MLP = ["model=mlp", "model.depth=4", "model.width=32", "data=digits", "train.steps=8", "train.warmup_steps=2"]


@pytest.fixture(scope="session")
def mlp_one_rank(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """That MLP on one rank with the global batch of 32: what every pipeline must equal."""
    return run_ok(tmp_path_factory.mktemp("mlp"), "one", *MLP, "cluster.ranks=1", "train.batch_per_rank=32")


# a transformer small enough for 8 ranks on 2 cores: 4 heads split 2 x 2, a sequence of 16 split 2 x 8
TINY_LM = [  # GPT-2's tied head: every layout that equals one rank keeps the tie (issue 71)
    "model=transformer",
    "model.width=32",
    "model.depth=2",
    "model.heads=4",
    "model.tie_embeddings=true",
    "data=tokens",
    "data.seq_len=16",
    "data.vocab_size=64",
    "data.num_samples=512",
    "train.steps=6",
    "train.warmup_steps=2",
]


@pytest.fixture(scope="session")
def lm_one_rank(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """That transformer on one rank with the global batch of 32: what every layout must equal."""
    return run_ok(
        tmp_path_factory.mktemp("lm"), "one", *TINY_LM, "cluster.ranks=1", "train.batch_per_rank=32"
    )


FAILURE_SAID = {
    "exception": "InjectedFailure: injected failure on rank 1 at step 3",
    "kill": "killed by signal 9",
}


def assert_rank_1_failure_named(tmp: Path, mode: str, *overrides: str) -> None:
    """Rank 1 raises or is killed at step 3: the run ends (no survivor waits for Gloo's 30-minute
    timeout) with exit 4, naming rank 1 and what happened to it."""
    r = hpctrain(
        "run",
        "--no-progress",
        f"run.dir={tmp / 'run'}",
        *overrides,
        "debug.fail_rank=1",
        "debug.fail_step=3",
        f"debug.fail_mode={mode}",
        timeout=180,
    )
    assert r.returncode == 4, r.stdout + r.stderr
    assert "rank 1 failed" in r.stderr and FAILURE_SAID[mode] in r.stderr, r.stderr


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (a test's own directory) and unmounted afterwards:
    whatever fills a disk in a test fills this one, never the machine's."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


def start_hpctrain(*args: str) -> subprocess.Popen[str]:
    """The real CLI started in the background (output piped), for tests that signal or race it."""
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain.cli", *args],
        cwd=ROOT,
        env=dict(os.environ, COLUMNS="200", TERM="dumb"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def run_cli():
    return hpctrain


WARM = ROOT / "tests" / "warm"


@pytest.fixture(scope="session", autouse=True)
def _warm_ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Local mpirun ranks and SLURM tasks forked from a zygote that has imported torch (tests/warm,
    docs/contributing.md): a rank's start costs about 0.5 CPU-s instead of 2.3 to 3.5, and the
    suite starts some 900 of them. The ranks are the real ones (mpirun or srun, MPI_Init, Horovod,
    the same `-m MODULE` run as __main__ on its node); only the interpreter's start and the
    imports are shared (SLURM 24.11's nodes, another root file system: a second zygote inside it,
    _rooted_zygote). Cold, as users start them: the tests marked cold_start (signals, stacks read
    from outside, orphans), a container's ranks, spawned ranks, a rank whose environment
    asks for another start (MALLOC_*, LD_*, PYTHON*: zygote.AT_START), and every rank with
    HPCTRAIN_TEST_COLD=1."""
    runs = any(i.get_closest_marker("mpi") or i.get_closest_marker("slurm") for i in request.session.items)
    if os.environ.get("HPCTRAIN_TEST_COLD") or not runs:  # every rank as users start them; no ranks
        yield
        return
    sock = tmp_path_factory.getbasetemp() / "zygote.sock"
    zygote = _start_zygote(sock)
    saved = {k: os.environ.get(k) for k in ("PATH", "HPCTRAIN_TEST_ZYGOTE", "HPCTRAIN_TEST_ZYGOTE_PYTHON")}
    os.environ["PATH"] = f"{WARM / 'bin'}:{os.environ['PATH']}"
    os.environ["HPCTRAIN_TEST_ZYGOTE"] = str(sock)
    os.environ["HPCTRAIN_TEST_ZYGOTE_PYTHON"] = sys.executable
    try:
        yield
    finally:
        zygote.kill()
        zygote.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _start_zygote(sock: Path, *inside: str) -> subprocess.Popen[bytes]:
    """A zygote serving at `sock`, started through `inside` (a root file system's wrapper, or
    nothing), once its socket is there: its imports take a few seconds, and the first ranks are
    warm too. One that dies or never answers leaves its clients starting their ranks cold."""
    # its own session: a test's Ctrl-C to its process group (fresh38) must not reach the zygote
    zygote = subprocess.Popen(
        [*inside, sys.executable, "-m", "tests.warm.zygote", str(sock)], cwd=ROOT, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not sock.exists() and zygote.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return zygote


@pytest.fixture(autouse=True)
def _cold_start(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("cold_start"):
        monkeypatch.delenv("HPCTRAIN_TEST_ZYGOTE", raising=False)


def processes_of(run_dir: Path) -> list[str]:
    """Live processes (not zombies) whose command line names the run directory."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    found = out.splitlines()[1:] + [f"{pid} {state} (warm) {argv}" for pid, state, argv in _zygote_ranks()]
    return [
        line for line in found if str(run_dir) in line and "ps -eo" not in line and line.split()[1][0] != "Z"
    ]


def _zygote_ranks() -> Iterator[tuple[int, str, str]]:
    """(pid, state, argv) of the zygotes' ranks still in the process table: a fork's own command
    line is the zygote's, so its records name what it runs."""
    if zygote := os.environ.get("HPCTRAIN_TEST_ZYGOTE"):
        for rec in [*Path(f"{zygote}.ranks").glob("*"), *Path(f"{zygote}.rooted.ranks").glob("*")]:
            with contextlib.suppress(OSError, IndexError):
                state = Path(f"/proc/{rec.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
                yield int(rec.name), state, rec.read_text()


def idle_ranks_of(run_dir: Path) -> int | None:
    """Move the run's live warm ranks into a CPU cgroup that runs only on CPU nothing else wants
    (cpu.idle); how many. None: the ranks start cold (HPCTRAIN_TEST_COLD=1) or no such cgroup can
    be made here, and they are left as they are. A rank whose peer's node was lost waits in MPI's
    progress loop (Horovod's background thread: 100 % of a core, mpi_yield_when_idle
    notwithstanding) until slurmctld flags the node and ends the step, some 30 s: two such ranks
    took 67 of the 22.05 lost-node test's 100 CPU-s (sampled). What the rank does is the same. Not
    SCHED_IDLE: the kernel's autogroups weigh a session as a whole, so an idle thread alone in its
    session still took a core's share beside two busy ones (2.5 of 5 CPU-s; in the cgroup, 0.03)."""
    if not os.environ.get("HPCTRAIN_TEST_ZYGOTE"):  # no warm ranks: no cgroup made for nothing
        return None
    group = _idle_group()
    if group is None:
        return None
    idled = 0
    for pid, state, argv in _zygote_ranks():
        if str(run_dir) not in argv or state == "Z":
            continue
        with contextlib.suppress(OSError):  # it ended meanwhile
            (group / "cgroup.procs").write_text(str(pid))
            idled += 1
    return idled


def _idle_group(make: bool = True) -> Path | None:
    """This session's idle CPU cgroup (cgroup v1 or v2, Linux 5.15+), made on first use; None
    where none can be made. drop_idle_group() and scripts/test.sh's exit remove it."""
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError):
        parent = v1 if (v1 / "cpu.shares").exists() else v2
        if parent == v1 or "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
            group = parent / f"hpctrain-tests-idle-{SLURM_VERSION}"
            if make:
                group.mkdir(exist_ok=True)
                (group / "cpu.idle").write_text("1")
            return group
    return None


def drop_idle_group() -> None:
    """Remove this session's idle cgroup once its processes have ended (else scripts/test.sh does)."""
    group = _idle_group(make=False)
    if group is not None:
        with contextlib.suppress(OSError):
            group.rmdir()


def wait_for(what: str, check: Callable[[], object], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _exiting(pid: int, cpu_before: float | None) -> tuple[str | None, float | None]:
    """Why a process that should be gone is still on its way out (None: no sign it is), and its
    CPU seconds so far (None once it has gone). On its way out: SIGKILL pending (a stopped rank
    is killed when it is next scheduled), uninterruptible sleep (the kernel finishing its I/O),
    or CPU used since the last look (running its exit path, or its lifeline noticing its parent)."""
    from hpctrain.workload.script_watch import cpu_s

    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "gone", None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    cpu = cpu_s(f"/proc/{pid}/stat")
    if any(int(fields.get(k, "0"), 16) & (1 << (signal.SIGKILL - 1)) for k in ("SigPnd", "ShdPnd")):
        return "SIGKILL pending", cpu
    if fields.get("State", "").strip().startswith("D"):
        return "in uninterruptible sleep", cpu
    if cpu_before is not None and cpu > cpu_before:
        return f"used {cpu - cpu_before:.2f} s of CPU", cpu
    return None, cpu


def wait_until_gone(run_dir: Path, timeout_s: float = 15, grace_s: float = 60) -> None:
    """No process of the run left. Past `timeout_s`, each one still there must show it is on its
    way out (_exiting) at every look to be waited for longer (at most `grace_s`): a busy machine
    slows an exit, it does not stop one. One asleep with nothing pending is an orphan, and fails
    at once, named with its state: not a deadline loosened until it passes."""
    deadline, cpu = time.monotonic() + timeout_s, dict[int, float | None]()
    while left := processes_of(run_dir):
        if time.monotonic() > deadline:
            why = {line: _exiting(int(line.split()[0]), cpu.get(int(line.split()[0]))) for line in left}
            stuck = [f"{line} (no sign of exiting)" for line, (reason, _) in why.items() if reason is None]
            assert not stuck, f"still there {timeout_s:g} s after the run ended: {stuck}"
            assert time.monotonic() < deadline + grace_s, f"exiting for over {grace_s:g} s more: {why}"
            cpu = {int(line.split()[0]): c for line, (_, c) in why.items()}
        time.sleep(0.2)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def signal_at_step(run_dir: Path, steps: int, timeout_s: float = 180) -> str:
    """Once rank 0 has recorded `steps` steps of a SLURM run started with --no-wait (held there by
    debug.hold_step or the script's own hold), send it what SLURM sends before the time limit."""
    job = json.loads((run_dir / "job.json").read_text())["job_id"]
    ended = job_ended_check(job)
    wait_for(
        f"step {steps} of job {job}",
        lambda: lines(run_dir / "steps-rank0.jsonl") >= steps or ended(),
        timeout_s,
    )
    if lines(run_dir / "steps-rank0.jsonl") < steps:  # it ended first: say how, not time out later
        errors = sorted((run_dir / "submitit").glob(f"{job}_*_log.err"))
        said = "".join(p.read_text(errors="replace")[-2000:] for p in errors)
        raise AssertionError(f"job {job} ended ({sacct_state(job)}) before step {steps}:\n{said}")
    subprocess.run(["scancel", "-s", "USR2", job], check=True)
    return job


ENDED_STATES = ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL")


def job_ended_check(job: str, every_s: float = 5.0) -> Callable[[], bool]:
    """A check, asking squeue at most every `every_s`, that the job has ended (left the queue, or
    listed in a final state: squeue -j shows ended jobs while slurmctld keeps them)."""
    asked = [0.0]

    def ended() -> bool:
        if time.monotonic() - asked[0] < every_s:
            return False
        asked[0] = time.monotonic()
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
        return out.returncode == 0 and out.stdout.strip() in ENDED_STATES

    return ended


# --- the real local SLURM cluster (slurm/start.sh), shared by every SLURM test of the session ---
# SLURM_VERSION=24.11 runs the SLURM tests marked slurm_versions against the 24.11 cluster (slurm/
# common.sh: its own state, ports and database, its clients first on PATH), beside 22.05's
SLURM_VERSION = os.environ.get("SLURM_VERSION", "22.05")
STATE = Path(
    os.environ.get("HPCTRAIN_SLURM_STATE")
    or ("/tmp/hpctrain-slurm" if SLURM_VERSION == "22.05" else f"/tmp/hpctrain-slurm-{SLURM_VERSION}")
)
SLURM_BIN = STATE / "bin"  # the 24.11 cluster's clients (wrappers into its root file system)


def _running(conf: str) -> bool:
    env = dict(os.environ, SLURM_CONF=conf, PATH=f"{SLURM_BIN}:{os.environ['PATH']}")
    if not (Path(conf).exists() and shutil.which("scontrol")):
        return False
    return subprocess.run(["scontrol", "ping"], env=env, capture_output=True).returncode == 0


def _stray_outputs() -> set[Path]:
    """SLURM's default output files (slurm-<job>.out) where the tests submit from."""
    return set(ROOT.glob("slurm-*.out")) | set(Path.cwd().glob("slurm-*.out"))


# Tests whose Horovod ranks wait on purpose (a held step, a slow or hung peer): in Horovod's 1-ms
# negotiation cycles a waiting rank spins most of a core over MPI (a quarter over Gloo), beside the
# other tests; 20-ms cycles leave it nearly idle (a 6-s wait: 11.8 -> 6.9 CPU-s for the run).
HOROVOD_IDLE = "parallelism.cycle_time_ms=20"

# A run kept going until the test cancels it (train.steps=100000) while the test waits for
# something else: rank 0 sleeps 50 ms before each backward pass and the others wait for it in
# 20-ms cycles, so the run steps on slowly instead of filling a core with training nobody reads.
IDLE_TRAINING = ["debug.slow_rank=0", "debug.slow_s=0.05", HOROVOD_IDLE]


# A run stopped by SLURM's own time limit (2 minutes, SIGUSR2 60 s before it), not a hand-sent
# signal: held at step 5 until the signal comes. Its waiting is SLURM's, about 80 s whatever the
# machine does, so its jobs start with the cluster and wait beside the other SLURM tests.
TIME_LIMIT = [
    "data=digits",
    "train.steps=20",
    "train.warmup_steps=2",
    "cluster=slurm",
    "cluster.nodes=1",
    "cluster.ranks_per_node=2",
    "cluster.time_min=2",
    "cluster.signal_delay_s=60",
    "debug.hold_step=5",
    # Horovod's controller over MPI spins a core per rank while the ranks hold (a minute, beside
    # the other tests); over Gloo it sleeps between cycles. The hand-signalled requeue tests cover
    # MPI. A cycle of 50 ms instead of 1: a held rank took 25% of a core (15 CPU-s a job), now ~1%.
    "parallelism.backend=gloo",
    "parallelism.cycle_time_ms=50",
]


@dataclass(frozen=True)
class SlurmCluster:
    conf: str  # SLURM_CONF
    time_limit_runs: dict[int, tuple[Path, str]]  # max_requeues -> (run directory, job id)


def _stop_if_last(users: IO[str], ours: Path) -> None:
    """Stop the cluster if a test session started it and this one is the last out (the one that
    gets STATE.users exclusively); release this session's hold."""
    with contextlib.suppress(BlockingIOError):
        fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if ours.exists():
            subprocess.run(
                ["bash", str(ROOT / "slurm" / "stop.sh")], capture_output=True, text=True, timeout=300
            )
            ours.unlink(missing_ok=True)
    users.close()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Start the cluster (slurm/start.sh is idempotent) and stop it afterwards only if a test
    session started it and no other session still uses it: every session holds a shared lock on
    STATE.users while it runs (the kernel drops it if the session dies), and the last one out, the
    one that gets the lock exclusively, stops it. A developer's own cluster is left alone, and two
    suites on one machine do not stop the cluster under each other.
    Every job hpctrain submits names its output files: none may land in the submitting directory.
    The time-limit runs (TIME_LIMIT, max_requeues 0 and 1) are submitted as soon as it is up."""
    before = _stray_outputs()
    conf = str(STATE / "etc" / "slurm.conf")
    users = open(f"{STATE}.users", "a")  # noqa: SIM115 (held for the whole session)
    fcntl.flock(users, fcntl.LOCK_SH)
    ours = STATE / "started-by-tests"
    if not _running(conf):
        STATE.mkdir(parents=True, exist_ok=True)
        ours.touch()
    try:
        r = subprocess.run(
            ["bash", str(ROOT / "slurm" / "start.sh")], capture_output=True, text=True, timeout=600
        )
    except BaseException:  # stopped mid-start (Ctrl-C; scripts/test.sh after a failed gate)
        _stop_if_last(users, ours)
        raise
    if r.returncode != 0:  # what this session started is stopped: no daemon outlives a failed start
        _stop_if_last(users, ours)
    assert r.returncode == 0, f"local SLURM cluster did not start:\n{r.stdout}\n{r.stderr}"
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    if SLURM_VERSION != "22.05":
        os.environ["PATH"] = clients_first(SLURM_BIN)
    rooted = _rooted_zygote()
    early = tmp_path_factory.mktemp("time-limit")
    runs = {n: early / f"max{n}" for n in (0, 1)}
    yield SlurmCluster(
        conf, {n: (d, start_run(d, *TIME_LIMIT, f"cluster.max_requeues={n}")) for n, d in runs.items()}
    )
    stray = _stray_outputs() - before
    if rooted is not None:
        rooted.kill()
        rooted.wait()
    _stop_if_last(users, ours)
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    assert not stray, (
        f"jobs wrote SLURM's default output files into the submitting directory: {sorted(stray)}"
    )


def clients_first(bin_dir: Path) -> str:
    """The PATH with a 24.11 cluster's clients first, after the warm wrappers (tests/warm/bin),
    which call the next srun on the PATH: its tasks start warm too."""
    warm = f"{WARM / 'bin'}:"
    rest = os.environ["PATH"].removeprefix(warm)
    return f"{warm if rest != os.environ['PATH'] else ''}{bin_dir}:{rest}"


def _rooted_zygote() -> subprocess.Popen[bytes] | None:
    """A cluster whose nodes run another root file system (SLURM 24.11's, slurm/in-root.sh): a
    second zygote started inside that root, as its nodes are, so that its tasks start warm too
    (the first zygote's libraries are the host's: its forks could not load that system's). Its
    socket is the first's with .rooted appended, where the client looks on such a node."""
    first = os.environ.get("HPCTRAIN_TEST_ZYGOTE")
    pid_file = STATE / "run" / "slurmd-n1.pid"
    if not first or SLURM_VERSION == "22.05" or not pid_file.exists():
        return None
    root = os.readlink(f"/proc/{int(pid_file.read_text())}/root")
    in_root = (str(ROOT / "slurm" / "in-root.sh"), root, str(STATE / "etc" / "binds"))
    return _start_zygote(Path(f"{first}.rooted"), *in_root)


def lose_node(name: str) -> list[int]:
    """Lose node `name` of the local cluster as a power cut would: SIGKILL every process in its
    slurmd's UTS namespace (slurm/start.sh gives each node one): the node's daemon first, so it
    reports nothing, then its step daemons, ranks and their guards. The pids killed."""
    daemon = int((STATE / "run" / f"slurmd-{name}.pid").read_text())
    ns = os.readlink(f"/proc/{daemon}/ns/uts")
    os.kill(daemon, signal.SIGKILL)
    killed = [daemon]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == daemon:
            continue
        with contextlib.suppress(OSError):
            if os.readlink(entry / "ns" / "uts") == ns:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    # it comes back as a rebooted node would: a step daemon removes its PMIx socket and directory
    # as it ends, a killed one cannot, and the same step of the job requeued onto the node could
    # then not make its own
    spool, tmp = STATE / "spool" / name, STATE / "tmp" / name  # its SlurmdSpoolDir and TmpFS
    for stale in [*spool.glob("stepd.slurm.pmix.*"), *spool.glob("pmix.*"), *tmp.glob("spmix_appdir_*")]:
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)
    return killed


def restore_nodes() -> None:
    """Start the local cluster's lost daemons again (slurm/start.sh is idempotent) and wait
    until every node answers."""
    r = subprocess.run(
        ["bash", str(ROOT / "slurm" / "start.sh")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr


def start_run(run_dir: Path, *overrides: str, cwd: Path | None = None) -> str:
    """`hpctrain run --no-wait` into run_dir: a job that runs beside what the test does next (a
    reference run beside the one the test interrupts); its job id."""
    r = hpctrain("run", "--no-wait", f"run.dir={run_dir}", *overrides, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return str(json.loads((run_dir / "job.json").read_text())["job_id"])


def wait_done(job: str, timeout_s: float = 300) -> str:
    """The final state of a SLURM job, polling sacct (it lags the job's end by a second or two)."""
    deadline = time.monotonic() + timeout_s
    while (state := sacct_state(job)) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        assert time.monotonic() < deadline, f"job {job} did not finish: {state}"
        time.sleep(1)
    return state


def recorded_steps(run_dir: Path, rank: int) -> list[int]:
    return [
        json.loads(line)["step"] for line in (run_dir / f"steps-rank{rank}.jsonl").read_text().splitlines()
    ]


def sacct_state(job_id: str) -> str:
    """The job's newest record's state (a resized job, one that lost a node, has one per shape)."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id], capture_output=True, text=True
    ).stdout.splitlines()
    return out[-1].split()[0] if out and out[-1].split() else ""  # "CANCELLED by 0" -> CANCELLED


USER_PROJECT = Path(__file__).parent / "user_project"


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """A user's own project (a package and training scripts) in a fresh git repository outside
    hpctrain's tree, as a user would have it: hpctrain must find it through code.dir alone."""
    return make_user_project(tmp_path)


def make_user_project(tmp: Path) -> Path:
    dest = tmp / "project"
    shutil.copytree(USER_PROJECT, dest, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(dest), "-c", "user.email=user@example.org", "-c", "user.name=user"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the user's code"], check=True)
    return dest


def replace_summary(s: Any, **changes: Any) -> Any:
    """dataclasses.replace for a record with parts (RunSummary, RankSummary, StepRecord) that also
    takes its parts' figures by the flat names records had before parts existed (records/parts.py:
    each part's FLAT at the record's level), e.g. stages=2 for a run, stage=1 for a rank."""
    import dataclasses

    from hpctrain.records.parts import part, types

    if not hasattr(s, "parts"):  # another record (analysis/stepmodel.py's Scale)
        return dataclasses.replace(s, **changes)
    parts = type(s.parts)(s.parts)
    for key, cls in types(type(s.parts).LEVEL).items():
        mine = {cls.FLAT[k]: changes.pop(k) for k in list(changes) if k in cls.FLAT}
        if mine:
            parts[key] = dataclasses.replace(part(s, cls), **mine)
    return dataclasses.replace(s, parts=parts, **changes)


def flat(record: dict[str, Any], cls: Any = None) -> dict[str, Any]:
    """A record as read (summary.json by default; a rank's entry or a step line with its class),
    its parts' figures under the flat names records had before parts existed (each part's defaults
    where the record has none): stages, tp_degree, bubble_s, ...; a summary's ranks likewise."""
    from hpctrain import records
    from hpctrain.records.parts import part, types

    cls = cls or records.RunSummary
    r = records.from_dict(cls, record)
    out = dict(record)
    for part_cls in types(type(r.parts).LEVEL).values():
        figures = part(r, part_cls)
        out.update({old: getattr(figures, new) for old, new in part_cls.FLAT.items()})
    if cls is records.RunSummary:
        out["per_rank"] = [flat(x, records.RankSummary) for x in record["per_rank"]]
    return out
