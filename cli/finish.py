"""How a walla command line ends: its exit code, and a short teardown after a successful heavy command.

Why: an interpreter that imported torch and transformers spends most of its exit, after the command's last
line is printed, in the garbage collector's passes over every object left; issue 31 asks every command to
answer at once. `gc.freeze()` moves every live object out of the collector's reach, so the exit is a normal
exit through public APIs only (non-daemon threads joined and thread pools woken to stop, exit handlers run,
streams flushed, modules freed), minus those passes. Measured after importing `walla.extract.run` and the hf
backend (2-core CPU under load 11-13): 6.9-8.7 s plain, 0.6-1.2 s frozen; the rest is torch's own teardown
(0.15 s with os._exit, which would also skip every exit handler).
"""

from __future__ import annotations

import gc
import sys
from typing import NoReturn

# commands whose successful end skips the collector's passes over what is left: each commits its writes
# before returning and leaves nothing to a finalizer (no open writer closed by `__del__`; loggers are
# finalized explicitly), so no cycle left at exit holds work that must be done
FAST_EXIT = ("extract", "train", "eval", "check", "demo")


def finish(code: int, command: str | None) -> NoReturn:
    """Exit with `code` through sys.exit. After a successful command of FAST_EXIT that imported torch (not
    `--help`, which imports nothing heavy), every live object is frozen first (gc.freeze), so the
    interpreter's teardown skips its garbage-collection passes over them; everything else about the exit is
    the interpreter's own: threads joined, exit handlers run, output flushed."""
    if code == 0 and command in FAST_EXIT and "torch" in sys.modules:
        gc.freeze()
    sys.exit(code)
