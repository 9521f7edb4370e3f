"""A stand-in rank for the zygote's own tests: `-m tests.warm.sample exit N | kill SIG | orphan | wait`."""

import os
import signal
import sys
import time

what = sys.argv[1]
mask = os.umask(0)
os.umask(mask)
signal.signal(signal.SIGTERM, lambda *_: (print("term", flush=True), os._exit(7)))
print(
    f"cwd={os.getcwd()} path={sys.path[:2]} x={os.environ.get('WARM_X')} argv={sys.argv[1:]} mask={mask:o} pid={os.getpid()}",
    flush=True,
)
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "orphan":  # a child left behind, as a multiprocessing pool's worker can be
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(f"child={child}", flush=True)
    sys.exit(0)
if what == "kill":
    os.kill(os.getpid(), int(sys.argv[2]))
time.sleep(60)
