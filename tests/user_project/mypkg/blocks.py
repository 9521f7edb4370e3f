"""A module that never finishes importing (a network call at import time, a lock)."""

import time

time.sleep(100000)
