"""How a walla command line ends: its exit code, and no teardown wait after a successful heavy command.

Why: an interpreter that imported torch and transformers spends ~0.85 s (the 2-core CPU; measured with and
without `os._exit` after importing `walla.extract.run` and the hf backend) freeing their modules one by one,
after the command's last line is printed (`walla train`'s modules: ~1.0 s). issue 31 asks every command to
answer at once.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

# commands whose successful end skips the interpreter's teardown: each commits its writes before returning
# and leaves nothing to a finalizer (no open writer closed by `__del__`; loggers are finalized explicitly)
FAST_EXIT = ("extract", "train", "eval", "check", "demo")


def finish(code: int, command: str | None) -> NoReturn:
    """Exit with `code`. After a successful command of FAST_EXIT that imported torch (not `--help`, which
    imports nothing heavy and has nothing to tear down), the process ends as the interpreter would end it, in
    its order, minus freeing every module: other threads are joined (thread pools woken to stop, as at
    shutdown), the exit handlers run (logging flushes, file locks are released, temporary folders removed,
    child processes joined, zarr's loop stops), stdout and stderr are flushed, then os._exit."""
    shutdown = getattr(threading, "_shutdown", None)  # CPython's own first step of finalization
    if code == 0 and command in FAST_EXIT and "torch" in sys.modules and shutdown is not None:
        shutdown()
        atexit._run_exitfuncs()  # CPython's exit handlers, as sys.exit would run them
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)
    sys.exit(code)
