"""Start a command as an MPI rank that has time to finish after mpirun ends it (for the tests only).

When a rank fails (MPI_Abort) or is killed, Open MPI's mpirun ends the others with SIGTERM and, about
0.25 s later (measured with Open MPI 5.0.11; PRTE_MCA_odls_base_sigkill_timeout does not change it),
SIGKILL. A rank that catches SIGTERM writes its INCOMPLETE document and removes its files in that time on a
quiet host, but not on a loaded one (the suite's 4 workers, or 2 busy processes beside it): the tests of that
path failed there, the rank's files missing. So this wrapper is the process mpirun starts and signals: it
runs the command in a session of its own, passes SIGTERM/SIGINT/SIGHUP on, and exits with its status. Should
mpirun then SIGKILL the wrapper, the rank itself carries on to its end. What is tested is the rank's own
answer to the signal; the SIGKILL after 0.25 s is mpirun's.

    python3 mpi_grace.py DIR COMMAND...

writes DIR/rank<R>.pid (the command's pid) at once and DIR/rank<R>.out / .err (its output: mpirun's
pipes close when it exits); `wait_for(DIR)` waits until each such command has ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _rank() -> str:
    return os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMIX_RANK") or "0"


def main(argv: list[str]) -> int:
    where, cmd = Path(argv[0]), argv[1:]
    where.mkdir(parents=True, exist_ok=True)
    rank = _rank()
    started: list[subprocess.Popen] = []
    pending: list[int] = []

    def forward(sig, _frame):  # (installed first: a signal before the command started is passed on after)
        if not started:
            pending.append(sig)
        elif started[0].poll() is None:
            started[0].send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    with open(where / f"rank{rank}.out", "wb") as out, open(where / f"rank{rank}.err", "wb") as err:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
    (where / f"rank{rank}.pid").write_text(str(child.pid))
    started.append(child)
    for sig in pending:
        child.send_signal(sig)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # (PEP 475 retries; kept for clarity)
            continue
    return code if code >= 0 else 128 - code


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_for(where: Path, timeout_s: float = 120.0) -> str:
    """Wait (bounded: only a hang reaches the deadline) until every command started through `where` has
    ended; their output, stdout then stderr, rank by rank."""
    deadline = time.monotonic() + timeout_s
    pids = [int(p.read_text()) for p in sorted(where.glob("rank*.pid"))]
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"a rank started through {where} was still running after {timeout_s:g} s")
        time.sleep(0.05)
    return "".join(p.read_text(errors="replace") for p in sorted([*where.glob("rank*.out"), *where.glob("rank*.err")]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
