"""A survivor of a lost MPI rank ends with exit 4 without MPI_Finalize, which can wait forever for the
failed peer under `mpirun --with-ft ulfm` (CI saw the survivor print its error and never exit)."""

from __future__ import annotations

import pytest

from kv_cache.core import group
from kv_cache.errors import ExitCode


class _Exited(Exception):
    pass


def _exit(code: int) -> None:
    raise _Exited(code)


def test_a_survivor_of_a_lost_rank_exits_at_once_with_4(monkeypatch):
    monkeypatch.setattr(group, "_ACTIVE", [object()])
    monkeypatch.setattr(group.os, "_exit", _exit)
    with pytest.raises(_Exited) as info:
        group.leave_after_lost_ranks(int(ExitCode.RANKS_LOST))
    assert info.value.args == (4,)


@pytest.mark.parametrize("active, code", [([], 4), ([object()], 0), ([object()], 3)])
def test_every_other_end_goes_through_mpi_finalize(monkeypatch, active, code):
    monkeypatch.setattr(group, "_ACTIVE", active)
    monkeypatch.setattr(group.os, "_exit", _exit)
    assert group.leave_after_lost_ranks(code) is None  # returns: the normal exit (and MPI_Finalize) follows
