"""Storage backends: how bytes move (memory slabs, files with O_DIRECT) and what was timed.

The cache layer decides *where* an entry lives; a store decides *how* its bytes move.  Every store
streams an entry chunk by chunk through the calling worker's preallocated :class:`WorkerBuffers` and
returns an :class:`IOResult` that separates device time from host time.
"""

from kv_cache.storage.base import (
    BLOCK,
    DataCorruption,
    IOAborted,
    IOResult,
    Store,
    StoreBase,
    StoreFull,
    key_id,
    padded,
)
from kv_cache.storage.buffers import WorkerBuffers
from kv_cache.storage.files import MEMORY_FS, FileStore, file_name, npy_header
from kv_cache.storage.memory import MemoryStore

__all__ = [
    "BLOCK",
    "MEMORY_FS",
    "DataCorruption",
    "FileStore",
    "IOAborted",
    "IOResult",
    "MemoryStore",
    "Store",
    "StoreBase",
    "StoreFull",
    "WorkerBuffers",
    "file_name",
    "key_id",
    "npy_header",
    "padded",
]
