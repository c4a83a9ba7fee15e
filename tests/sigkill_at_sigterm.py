"""Run kv-cache as a process that SIGKILLs itself the moment a stop signal reaches its run (for the tests only).

Plain `mpirun` ends the surviving ranks with SIGTERM when one dies and SIGKILLs them about 0.25 s later
(Open MPI 5.0.11), so a rank on a loaded host may get no time at all to write its final document. This
makes that worst case certain rather than a race: the run's stop-signal handler (benchmarks/standard/run.py
Interrupts) is replaced in this process by one that sends SIGKILL to the process itself, so nothing the run
does after the signal (its final document, its clean-up) happens. What is left on disk is what was there
before the signal: the rank's last periodic document.

    python3 sigkill_at_sigterm.py KV_CACHE_PY ARGS...
"""

from __future__ import annotations

import os
import runpy
import signal
import sys


def _die(_self, _signum, _frame) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str]) -> None:
    script = argv[0]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    from kv_cache.benchmarks.standard import run  # noqa: PLC0415  (from the checkout named by `script`)

    run.Interrupts.__call__ = _die  # (this process only: it is the rank's own)
    sys.argv = [script, *argv[1:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
