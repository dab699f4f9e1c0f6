"""How a walla command line ends: its exit code, and no teardown wait after a successful extraction.

Why: an interpreter that imported torch and transformers spends ~0.85 s (the 2-core CPU; measured with and
without `os._exit` after importing `walla.extract.run` and the hf backend) freeing their modules one by one,
after the command's last line is printed. issue 31 asks every command to answer at once.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

# commands whose successful end skips the interpreter's teardown (their writes are committed on return)
FAST_EXIT = ("extract",)


def finish(code: int, command: str | None) -> NoReturn:
    """Exit with `code`. After a successful command of FAST_EXIT that imported torch (not `--help`, which
    imports nothing heavy and has nothing to tear down), the exit handlers run (logging flushes, file
    locks are released, temporary folders removed, child processes joined, zarr's loop stops), stdout and
    stderr are flushed, and the process ends without the interpreter's teardown (os._exit): every store write
    is committed before the command returns, so nothing waits on it."""
    if code == 0 and command in FAST_EXIT and "torch" in sys.modules:
        atexit._run_exitfuncs()  # CPython's own exit handlers, as sys.exit would run them
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)
    sys.exit(code)
