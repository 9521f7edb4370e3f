"""Forks test ranks from a process that has imported torch already (tests/warm/client.py).

Run as: python -m tests.warm.zygote SOCKET [--bare]. Each connection is one rank: the fork takes the
client's streams, environment, working directory and argv and runs `-m MODULE ARGS` as __main__.
The zygote writes the rank's pid, and later its wait status, back to the client; a client that
goes away (mpirun killed it) takes its rank with it (SIGKILL)."""

import array
import contextlib
import ctypes
import io
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import traceback

from hpctrain.lifeline import become_subreaper, die_with_parent, stat_fields

START_ENV = dict(os.environ)  # before the imports: the start a fork stands in for
ADDED: dict[str, str] = {}  # what the imports put in the environment (torch: TORCHINDUCTOR_CACHE_DIR)


def preload() -> None:
    import numpy  # noqa: F401
    import submitit  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401

    import hpctrain.config.derived  # noqa: F401
    import hpctrain.engine.ddp_wrap  # noqa: F401
    import hpctrain.engine.device  # noqa: F401
    import hpctrain.engine.fsdp_wrap  # noqa: F401  (torch.distributed.fsdp, torch._dynamo: 1-3 s)
    import hpctrain.launch.slurm.job  # noqa: F401
    import hpctrain.parallel.pipeline.kind  # noqa: F401
    import hpctrain.parallel.sharded.kind  # noqa: F401
    import hpctrain.parallel.tensor.split  # noqa: F401
    import hpctrain.records  # noqa: F401
    import hpctrain.train.loop  # noqa: F401
    from hpctrain.config.load import schema_node
    from hpctrain.config.schema import CLUSTER_SCHEMAS
    from hpctrain.train.data import _digits_table

    for cluster in CLUSTER_SCHEMAS:  # what each rank's read of its config.yaml starts from
        schema_node(cluster)
    # Horovod's module (its MPI library loaded, MPI not started: hvd.init() starts it in the
    # rank) and the digits, which most ranks read: 50 and 30 ms of each such rank's CPU
    with contextlib.suppress(ImportError):
        import horovod.torch  # noqa: F401
    with contextlib.suppress(ModuleNotFoundError):
        _digits_table()
    ADDED.update({k: v for k, v in os.environ.items() if START_ENV.get(k) != v})


def receive(conn: socket.socket) -> tuple[dict, list[int]]:
    fds = array.array("i")
    msg, anc, _, _ = conn.recvmsg(4, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    (size,) = struct.unpack("!I", msg)
    body = b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return json.loads(body), list(fds)


CLONE_NEWNS, CLONE_NEWUTS = 0x00020000, 0x04000000  # <linux/sched.h>


def join_node(client: int) -> None:
    """The client's node, where it differs from the zygote's: slurm/start.sh gives each node of
    the local cluster its own host name (UTS namespace) and /etc/hosts (mount namespace), and
    SLURM 24.11's nodes a root file system of their own (a chroot inside that namespace)."""
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.open(f"/proc/{client}/root", os.O_RDONLY | os.O_DIRECTORY)  # before setns resets it
    for name, kind in (("uts", CLONE_NEWUTS), ("mnt", CLONE_NEWNS)):
        if os.readlink(f"/proc/{client}/ns/{name}") == os.readlink(f"/proc/self/ns/{name}"):
            continue
        fd = os.open(f"/proc/{client}/ns/{name}", os.O_RDONLY)
        if libc.setns(fd, kind) != 0:
            raise OSError(ctypes.get_errno(), f"setns({name}) into the node of pid {client}")
        os.close(fd)
        if kind == CLONE_NEWNS:  # setns put the root at the namespace's: the client's again
            os.fchdir(root)
            os.chroot(".")
    os.close(root)


def same_root(client: int) -> bool:
    """Whether the client runs on the zygote's root file system (the same directory, whichever
    mount namespace each sees it in): the libraries a fork has loaded are then the ones its start
    would load."""
    theirs, ours = os.stat(f"/proc/{client}/root"), os.stat("/")
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


def become_rank(request: dict, fds: list[int], client: int) -> None:
    """In the fork: the client's process, as `python [-u] -m MODULE ARGS` would have started it."""
    try:
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        join_node(client)
        os.setsid()  # a process group of its own, as a task's: hpctrain's guard ends its orphans
        os.chdir(request["cwd"])
        os.umask(request["umask"])  # the client's, as a started process inherits it
        os.environ.clear()
        os.environ.update({**ADDED, **request["env"]})  # as the same imports would have left it
        argv = request["argv"]
        if argv[:1] == ["-u"]:  # unbuffered standard streams, as python -u makes them
            argv = argv[1:]
            for name, fd in (("stdout", 1), ("stderr", 2)):
                setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), write_through=True))
        if argv[:1] != ["-m"] or len(argv) < 2:
            raise SystemExit(f"zygote: runs [-u] -m MODULE ARGS only, not {argv}")
        if (mmap := os.environ.get("MALLOC_MMAP_THRESHOLD_", "")).isdigit():  # as glibc reads it
            ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, int(mmap))  # at the start: the same setting
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if "torch" in sys.modules and threads.isdigit():  # OpenMP read it when torch loaded
            sys.modules["torch"].set_num_threads(int(threads))
        sys.path[:] = python_path(os.getcwd(), request["env"])
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# What a process reads from its environment as it starts (the dynamic loader, glibc's malloc, the
# interpreter, OpenMP and BLAS as torch loads them): a fork would keep the zygote's. A request
# whose values differ from the zygote's is started cold instead (the client execs Python). torch
# reads its own variables (TORCH_*, TORCHINDUCTOR_*) when a feature is first used, after the fork.
AT_START = ("LD_", "MALLOC_", "GLIBC_", "PYTHON", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
# what become_rank does as the start would: any PYTHONPATH; a number of threads or bytes (another
# value, which it would not apply as the start reads it, starts the rank cold)
HANDLED = {
    "PYTHONPATH": lambda v: True,
    "OMP_NUM_THREADS": str.isdigit,
    "MALLOC_MMAP_THRESHOLD_": str.isdigit,
}
M_MMAP_THRESHOLD = -3  # <malloc.h>: mallopt's name for MALLOC_MMAP_THRESHOLD_ (which also fixes it)


def differs(env: dict[str, str]) -> list[str]:
    """The start-time variables of `env` that differ from the zygote's as its imports left them."""
    expected = {**START_ENV, **ADDED}
    keys = {k for k in (*env, *expected) if k.startswith(AT_START)}
    keys -= {k for k, applies in HANDLED.items() if k not in env or applies(env[k])}
    return sorted(k for k in keys if env.get(k) != expected.get(k))


def python_path(cwd: str, env: dict[str, str]) -> list[str]:
    """sys.path as `python -m` would start it there: the working directory, PYTHONPATH, then the
    interpreter's own (the zygote's, less its working directory and PYTHONPATH)."""

    def entries(e: dict[str, str]) -> list[str]:
        return [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p]

    own = sys.path[1 + len(entries(START_ENV)) :]
    return [cwd, *entries(env), *own]


def children() -> set[int]:
    """This process's children, its ranks and what it adopted, from each of its threads' list
    (/proc/PID/task/TID/children): a few small reads, where a scan of /proc read every process's
    stat (15 ms with some 400 processes, at least once a second for a whole suite)."""
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
            found.update(int(p) for p in f.read().split())
    return found


def end_orphans(ranks: dict[int, tuple[socket.socket, int]]) -> None:
    """A rank's processes left behind when it ended (a multiprocessing pool's workers, a detached
    child) are re-parented here, the subreaper, where a cold rank's would go to its launcher (the
    local supervisor ends them, on SLURM the rank's guard and the step): ended, and reaped. Those
    of a rank still running (their session, which every rank starts, is the rank's) are its."""
    for pid in children() - set(ranks):
        fields = stat_fields(f"/proc/{pid}/stat")
        if fields is None:
            continue
        state, session = fields[0], int(fields[3])
        if session in ranks:
            continue
        if state != "Z":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def serve(path: str, bare: bool = False) -> None:
    if not bare:
        preload()
    become_subreaper()
    die_with_parent(signal.SIGKILL)  # gone with the tests' session
    os.makedirs(f"{path}.ranks", exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, ("listener", 0))
    ranks: dict[int, tuple[socket.socket, int]] = {}  # pid: (its client, its pidfd)
    while True:
        end_orphans(ranks)
        for key, _ in sel.select(timeout=1.0):
            kind, pid = key.data
            if kind == "listener":
                conn, _ = listener.accept()
                request, fds = receive(conn)
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                client = struct.unpack("3i", creds)[0]
                # another root file system (SLURM 24.11's nodes, to a zygote outside it): its
                # libraries are not the ones the zygote loaded (its glibc is newer): cold
                why = differs(request["env"])
                if not same_root(client):
                    why.append(f"root {os.readlink(f'/proc/{client}/root')}")
                if why:
                    with open(f"{path}.cold", "a") as f:  # which ranks started cold, and why
                        f.write(f"{' '.join(request['argv'][:4])}: {', '.join(why)}\n")
                    for fd in fds:
                        os.close(fd)
                    with contextlib.suppress(OSError):
                        conn.sendall(b"cold\n")
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    for other in (listener, conn, *(c for c, _ in ranks.values())):
                        other.close()
                    for _, pidfd in ranks.values():
                        os.close(pidfd)
                    become_rank(request, fds, client)
                for fd in fds:
                    os.close(fd)
                with open(f"{path}.ranks/{pid}", "w") as f:  # for the tests' processes_of()
                    f.write(" ".join(request["argv"]))
                with open(f"{path}.served", "a") as f:  # how many, and which (the suite's figures)
                    f.write(" ".join(request["argv"][:4]) + "\n")
                pidfd = os.pidfd_open(pid)  # readable once the rank has ended: seen at once
                ranks[pid] = (conn, pidfd)
                sel.register(pidfd, selectors.EVENT_READ, ("ended", pid))
                sel.register(conn, selectors.EVENT_READ, ("client", pid))
                with contextlib.suppress(OSError):
                    conn.sendall(f"{pid}\n".encode())
            elif kind == "client":  # the client went away before its rank ended
                if pid not in ranks:  # ended in this same batch of events: handled, closed
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                sel.unregister(key.fileobj)
            elif pid in ranks:
                conn, pidfd = ranks.pop(pid)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{path}.ranks/{pid}")
                with contextlib.suppress(OSError):
                    conn.sendall(f"{status}\n".encode())
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(conn)
                sel.unregister(pidfd)
                os.close(pidfd)
                conn.close()


if __name__ == "__main__":
    serve(sys.argv[1], bare="--bare" in sys.argv[2:])  # --bare: nothing preloaded (its own tests)
