"""Storage errors as the run sees them: which ones are worth retrying, which ones end the run, and a
message that names the path, the error and (for a full disk) the free space against the entry size.

The cache wraps every OSError a store raises into a :class:`StorageFault` (still an OSError with the
same errno) so that whoever counts or reports it has the tier, the operation and the path at hand.
"""

from __future__ import annotations

import errno
import os
from typing import Any

# Errors that may go away if the operation is tried again (a flaky device, a FUSE daemon restarting).
TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.ENOTCONN, errno.EAGAIN})
# Errors after which continuing would measure nothing meaningful: the run stops at the first one. ETIMEDOUT
# and EHOSTDOWN: a remote tier's server stopped answering past the run's deadline, or stayed lost for the
# whole failover budget (storage/remote.py).
FATAL_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.ETIMEDOUT,
                          errno.EHOSTDOWN})


def errno_name(exc: BaseException) -> str:
    """'EIO', 'ENOSPC', ... or the exception's class name when it carries no errno."""
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, str(code)) if code is not None else type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS


def is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FATAL_ERRNOS


class StorageFault(OSError):
    """An OSError of one tier operation, with where it happened (errno kept: `except OSError` still works)."""

    def __init__(self, code: int | None, message: str, tier: str, op: str, path: str | None) -> None:
        super().__init__(code, message)
        self.tier, self.op, self.path = tier, op, path
        self.message = message

    def __str__(self) -> str:
        return self.message


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def free_space(path: str) -> int | None:
    """Bytes available to unprivileged users on the filesystem holding `path` (None: unknown)."""
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def describe(exc: OSError, tier: str, op: str, store: Any, key: str, nbytes: int | None) -> StorageFault:
    """The fault for `exc` raised by `store` while doing `op` on `key` (an entry of `nbytes`, if known)."""
    if isinstance(exc, StorageFault):
        return exc
    path = getattr(exc, "filename", None)
    if path is None and hasattr(store, "path_of"):
        try:
            path = os.fspath(store.path_of(key))
        except Exception:  # a store that cannot name the path: say so below
            path = None
    where = path or f"{tier} entry {key!r}"
    reason = exc.strerror or str(exc)
    message = f"{tier} {op} of {where} failed: {errno_name(exc)} ({reason})"
    if exc.errno == errno.ENOSPC and path is not None and os.path.isabs(path):  # (a remote tier's is a URL)
        free = free_space(path)
        on_disk = store.footprint(nbytes) if nbytes is not None and hasattr(store, "footprint") else nbytes
        size = f"{_mib(on_disk)} on disk" if on_disk is not None else "of unknown size"
        message += f"; entry {size}, {_mib(free) if free is not None else 'unknown'} free on that filesystem"
    return StorageFault(exc.errno, message, tier, op, path)
