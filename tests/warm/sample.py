"""A stand-in rank for the zygote's own tests: `-m tests.warm.sample exit N | kill SIG | wait`."""

import os
import signal
import sys
import time

what = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: (print("term", flush=True), os._exit(7)))
print(f"cwd={os.getcwd()} x={os.environ.get('WARM_X')} argv={sys.argv[1:]} pid={os.getpid()}", flush=True)
if what == "exit":
    sys.exit(int(sys.argv[2]))
if what == "kill":
    os.kill(os.getpid(), int(sys.argv[2]))
time.sleep(60)
