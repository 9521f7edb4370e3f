"""Prints bytes that are not UTF-8 (a cut emoji, as a chunked stream may deliver one, and a bare
0xff) on stdout and stderr, then a last line: the run must end and keep every line."""

import sys

sys.stdout.buffer.write(b"raw \xff\xfe bytes\n")
sys.stdout.flush()
sys.stderr.buffer.write("GLHF! \U0001f3d6".encode()[:-2] + b"\n")
sys.stderr.flush()
print("last line", flush=True)
