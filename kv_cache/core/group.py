"""The ranks of one run (mpirun, or `--processes` on one host): barriers around the measured window and the
gathering of every rank's results, so that one common window and one merged document come out.

A RankGroup is what the driver and the composition root see; `mpi_group` builds one on mpi4py when the
launcher started several ranks (mpi4py is imported only then: importing it initialises MPI).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from typing import Any, Protocol

from kv_cache.errors import ExitCode, KvCacheError, RanksLost

__all__ = ["GroupBroken", "RankGroup", "abort_peers", "leave_after_lost_ranks", "mpi_group", "open_group", "shared_filesystem_count",
           "shared_run_id"]

_ACTIVE: list[MpiGroup] = []  # the MPI group of this process, once mpi_group made one


log = logging.getLogger("kv_cache")

class GroupBroken(RanksLost):
    """A collective of the group can never complete: another rank failed or was lost (a broken barrier).
    Uncaught (a rank lost before the window, under `mpirun --with-ft ulfm`), it ends the run with exit 4."""


class RankGroup(Protocol):
    """rank / size of this process in the group; collective operations every rank calls in the same order.

    `barrier` raises GroupBroken when another rank failed or was lost, rather than waiting for ever."""

    rank: int
    size: int
    gather_waits: bool  # gather is a collective every rank must reach (MPI); False: a rank sends alone

    def barrier(self) -> None: ...

    def allgather(self, obj: Any) -> list[Any]: ...

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` in rank order at rank 0; None at the other ranks."""


FAILED_TAG = 0x6B76  # point-to-point tag of MpiGroup.abort's notice "rank R failed"
ACK_TAG = 0x6B77  # a rank's answer to that notice: it has read it (its document will name the failed rank)
ABORT_WAIT_S = 30.0  # how long a rank that read that notice waits for mpirun to end it
ACK_WAIT_S = 5.0  # how long the failed rank waits for the others' answers before it ends the job


class MpiGroup:
    """A RankGroup on an mpi4py communicator (COMM_WORLD, or the survivors of it: `survivors`).

    mpi4py's communicators return MPI errors as exceptions (MPI.ERRORS_RETURN): a collective that a lost
    rank can never complete (seen under `mpirun --with-ft ulfm`, where the launcher lets the others live)
    raises GroupBroken. `world_ranks`: the COMM_WORLD rank of each member, in this group's rank order."""

    gather_waits = True

    def __init__(self, comm: Any, world_ranks: list[int] | None = None) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.world_ranks = world_ranks if world_ranks is not None else list(range(self.size))
        self.failed_rank: int | None = None  # COMM_WORLD rank whose failure notice this rank read (barrier)
        self._barriers = 0  # barriers entered: the first listens for failure notices (barrier)

    def _call(self, what: str, op: Any, *args: Any, **kwargs: Any) -> Any:
        from mpi4py import MPI  # noqa: PLC0415  (already imported: this group was made on it)

        try:
            return op(*args, **kwargs)
        except MPI.Exception as exc:
            raise GroupBroken(f"MPI {what} failed: another rank was lost ({exc})") from None

    def barrier(self) -> None:
        """The first barrier (the one that opens the window, where the ranks wait for a rank still setting
        up) keeps listening: while it waits, a notice from a rank that failed (abort) is read into
        `failed_rank`, so that when mpirun then ends this rank, its document names the rank that failed (an
        MPI call after that rank is gone would itself be fatal, so nothing is read later). Later barriers
        (the window's close) block in MPI_Barrier, whose failure under ULFM is GroupBroken."""
        self._barriers += 1
        if self._barriers > 1:
            self._call("barrier", self.comm.Barrier)
            return
        request = self._call("barrier", self.comm.Ibarrier)
        while not self._call("barrier", request.Test):
            if self._read_failure_notice():
                # the failed rank is aborting the job: no more MPI calls (fatal once it is gone); wait for
                # mpirun to end this rank (SIGTERM: the run's interrupt path writes its document)
                deadline = time.monotonic() + ABORT_WAIT_S
                while time.monotonic() < deadline:
                    time.sleep(0.05)
                raise GroupBroken(f"rank {self.failed_rank} failed and the job was not ended within "
                                  f"{ABORT_WAIT_S:.0f} s")
            time.sleep(0.001)

    def _read_failure_notice(self) -> bool:
        from mpi4py import MPI  # noqa: PLC0415

        status = MPI.Status()
        if not self._call("barrier", self.comm.iprobe, source=MPI.ANY_SOURCE, tag=FAILED_TAG, status=status):
            return False
        self.failed_rank = int(self._call("barrier", self.comm.recv, source=status.Get_source(), tag=FAILED_TAG))
        try:  # tell the failed rank this one has read it: it ends the job only then (abort), so it is alive
            answer = self.comm.isend(self.rank, dest=status.Get_source(), tag=ACK_TAG)  # while this completes
            deadline = time.monotonic() + ACK_WAIT_S
            while not answer.Test() and time.monotonic() < deadline:
                time.sleep(0.001)
        except MPI.Exception as exc:
            log.debug("could not answer rank %d's failure notice: %s", self.failed_rank, exc)
        return True

    def allgather(self, obj: Any) -> list[Any]:
        return self._call("allgather", self.comm.allgather, obj)

    def gather(self, obj: Any) -> list[Any] | None:
        return self._call("gather", self.comm.gather, obj, root=0)

    def survivors(self) -> tuple[MpiGroup, list[int]]:
        """The ranks still alive, as a group of their own (a collective every live rank calls: MPI's
        fault-tolerant MPIX_Comm_shrink), and the COMM_WORLD ranks lost. Its rank 0 is the lowest live
        rank. Where the MPI has no fault tolerance (Shrink unsupported), this group and none lost: there
        a lost rank has ended the whole job anyway."""
        from mpi4py import MPI  # noqa: PLC0415

        try:
            shrunk = self.comm.Shrink()
        except (AttributeError, NotImplementedError, MPI.Exception) as exc:
            log.debug("MPI cannot shrink the communicator (%s): assuming every rank is alive", exc)
            return self, []
        alive = self._call("allgather", shrunk.allgather, self.world_ranks[self.rank])
        lost = sorted(set(self.world_ranks) - set(alive))
        return MpiGroup(shrunk, alive), lost

    def abort(self, code: int) -> None:
        """End the whole job with `code`; first each other rank is sent a notice naming this rank (tag
        FAILED_TAG, small enough to be sent eagerly), which a rank waiting at a barrier reads
        (`failed_rank`), so that its document says which rank failed rather than only that it was ended.
        The job ends once every other rank has answered that it read the notice (ACK_TAG), or after
        ACK_WAIT_S: a fixed courtesy pause was too short on a loaded host, where the waiting rank was not
        scheduled before mpirun's SIGTERM and its document said only "interrupted". A rank in the middle
        of its window does not read notices, so a failure then ends the job ACK_WAIT_S later."""
        from mpi4py import MPI  # noqa: PLC0415

        try:
            me = self.world_ranks[self.rank]
            others = [r for r in range(self.size) if r != self.rank]
            sent = [self.comm.isend(me, dest=r, tag=FAILED_TAG) for r in others]
            answers = [self.comm.irecv(source=r, tag=ACK_TAG) for r in others]
            deadline = time.monotonic() + ACK_WAIT_S
            while time.monotonic() < deadline and not (MPI.Request.Testall(sent) and MPI.Request.Testall(answers)):
                time.sleep(0.01)
        except Exception as exc:  # the notice is a courtesy: the abort must happen whatever it met
            log.debug("could not tell the other ranks which rank failed: %s", exc)
        self.comm.Abort(code)


class MpiUnavailable(KvCacheError):
    """Several ranks were launched but mpi4py cannot be imported."""


def mpi_group(world_size: int) -> MpiGroup | None:
    """The MPI group when the launcher's environment says `world_size` > 1; None for a single rank.

    Raises MpiUnavailable when mpi4py is missing (the ranks would run unaligned windows)."""
    if world_size <= 1:
        return None
    try:
        from mpi4py import MPI  # noqa: PLC0415  (initialises MPI: only under a launcher)
    except ImportError as exc:
        raise MpiUnavailable(f"{world_size} MPI ranks but mpi4py cannot be imported ({exc})") from None
    group = MpiGroup(MPI.COMM_WORLD)
    if group.size <= 1:
        return None
    _ACTIVE.append(group)
    return group


def open_group(world_size: int) -> RankGroup | None:
    """The MPI ranks of this run when the launcher started several; without mpi4py each runs alone."""
    try:
        return mpi_group(world_size)
    except MpiUnavailable as exc:
        log.warning("%s: each rank measures its own window and no merged result is written "
                    "(pip install 'kv-cache[mpi]' with the system's Open MPI, or 'kv-cache[mpi-bundled]'; or `kv-cache "
                    "merge` the rank files afterwards)", exc)
        return None


def abort_peers(code: int) -> None:
    """A rank that fails ends the whole MPI job (exit status `code`): the other ranks would otherwise wait
    for it at a barrier, and MPI_Finalize waits for them, forever. Nothing happens outside MPI.

    Not for ranks lost (exit 4): only a launcher that let the others live (`mpirun --with-ft ulfm`) gets
    there, where every live rank sees the same broken collective and ends by itself; MPI_Abort there
    would make `mpirun` exit 0 instead of the ranks' 4."""
    if _ACTIVE and code != ExitCode.RANKS_LOST:
        _ACTIVE[0].abort(code)


def leave_after_lost_ranks(code: int) -> None:
    """Under MPI with a rank lost (exit 4: only `mpirun --with-ft ulfm` lets a survivor get here), end this
    process now with `code`, without MPI_Finalize: with a failed peer, Open MPI's Finalize can wait forever
    (seen in CI: the survivor printed its one-line error, wrote what it had, and never exited, so mpirun
    never ended). Called last, once every file is written and the streams are flushed."""
    if not _ACTIVE or code != ExitCode.RANKS_LOST:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a gone reader or a closed stream: nothing more to say
            pass
    os._exit(code)


def filesystem_id(path: str) -> str:
    """An id of the filesystem `path` is on (its nearest existing ancestor): statvfs f_fsid, else st_dev."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    fsid = os.statvfs(path).f_fsid
    return f"fsid:{fsid:x}" if fsid else f"dev:{os.uname().nodename}:{os.stat(path).st_dev:x}"


def shared_filesystem_count(group: RankGroup | None, path: str | None) -> int:
    """How many ranks of the group (this one included) put their cache on the filesystem of `path`."""
    if group is None or path is None:
        return 1
    ids = group.allgather(filesystem_id(path))
    return max(1, ids.count(ids[group.rank]))


def shared_run_id(group: RankGroup | None, run_id: str | None = None) -> str:
    """The id of this run, one for all its ranks: rank 0's (`run_id`, or a new random one) sent to every rank
    (a collective call: every rank makes it at the same point). Alone, this process's own."""
    mine = run_id or uuid.uuid4().hex
    if group is None or group.size <= 1:
        return mine
    return str(group.allgather(mine)[0])
