"""Libraries mapped into this process, and which of them interpose the calls a storage benchmark relies on.

An LD_PRELOAD shim (libeatmydata, a "nofadvise" library) turns `fsync` or `posix_fadvise(DONTNEED)` into
no-ops: writes then "complete" in the page cache and reads are served from memory, while the results still
say "device". `process_libraries()` reads `/proc/self/maps` for every shared object the process has mapped,
and names those that *define* (export) one of the watched functions, other than the C library itself. The
symbols are read from each library's ELF dynamic symbol table (`.dynsym`) with the small reader below:
`dlsym` on a library's handle would also find the symbol in the libraries it depends on (every library
linked against libc "has" fsync that way), so it cannot tell a shim from an ordinary library.

Recorded once at the start of a run (`snapshot_at_start`), kept in the results under
`measurement.process_libraries`, and judged by `kv-cache audit` (results/integrity.py). Linux only; elsewhere
the snapshot says it could not look.
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

WATCHED = ("fsync", "fdatasync", "posix_fadvise", "posix_fadvise64", "open", "open64", "openat", "openat64",
           "sync_file_range", "msync")
# The C library and the dynamic loader define these calls by design; older glibc split them into libpthread.
_SYSTEM_PREFIXES = ("libc.so", "libc-", "libpthread.so", "libpthread-", "ld-linux", "ld64.so", "ld-musl", "libc.musl")
_MAPS = "/proc/self/maps"
_SHT_DYNSYM = 11
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_STB_GLOBAL, _STB_WEAK = 1, 2

_AT_START: dict[str, Any] | None = None


def mapped_libraries(maps_path: str = _MAPS) -> list[str]:
    """Paths of the shared objects mapped into the process (`/proc/self/maps`), in first-mapped order."""
    seen: dict[str, None] = {}
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].strip()
                    if path.startswith("/") and ".so" in os.path.basename(path):
                        seen.setdefault(path, None)
    except OSError:
        return []
    return list(seen)


def defined_functions(path: str, names: tuple[str, ...] = WATCHED) -> list[str]:
    """Which of `names` the ELF shared object at `path` defines and exports (global or weak functions with a
    section in its `.dynsym`); [] for a file that is not a readable 64- or 32-bit ELF. Reads only the ELF
    header, the section headers and the dynamic symbol and string tables (a GPU library can be 1 GB)."""
    try:
        with open(path, "rb") as fh:
            return _dynsym_functions(fh, set(names))
    except (OSError, struct.error, IndexError, ValueError):
        return []


def _read(fh: BinaryIO, offset: int, size: int) -> bytes:
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise ValueError("truncated ELF file")
    return data


def _dynsym_functions(fh: BinaryIO, wanted: set[str]) -> list[str]:
    ident = fh.read(64)
    if ident[:4] != b"\x7fELF" or len(ident) < 52:
        return []
    is64, end = ident[4] == 2, "<" if ident[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(end + "Q", ident, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", ident, 0x3A)
        sec_fmt, sym_fmt, sym_size = end + "IIQQQQIIQQ", end + "IBBHQQ", 24
    else:
        shoff, = struct.unpack_from(end + "I", ident, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", ident, 0x2E)
        sec_fmt, sym_fmt, sym_size = end + "IIIIIIIIII", end + "IIIBBH", 16
    table = _read(fh, shoff, shentsize * shnum)
    sections = [struct.unpack_from(sec_fmt, table, i * shentsize) for i in range(shnum)]
    found: set[str] = set()
    for sec in sections:
        if sec[1] != _SHT_DYNSYM:
            continue
        symbols = _read(fh, sec[4], sec[5])
        strtab = _read(fh, sections[sec[6]][4], sections[sec[6]][5])
        for i in range(len(symbols) // sym_size):
            sym = struct.unpack_from(sym_fmt, symbols, i * sym_size)
            st_name, st_info, st_shndx = (sym[0], sym[1], sym[3]) if is64 else (sym[0], sym[3], sym[5])
            if st_shndx == 0 or (st_info >> 4) not in (_STB_GLOBAL, _STB_WEAK):
                continue
            if (st_info & 0xF) not in (_STT_FUNC, _STT_GNU_IFUNC):
                continue
            name = strtab[st_name:strtab.index(b"\0", st_name)].decode("ascii", "replace")
            if name in wanted:
                found.add(name)
    return sorted(found)


def is_system_library(path: str) -> bool:
    """The C library or the dynamic loader: they define the watched calls by design."""
    return os.path.basename(path).startswith(_SYSTEM_PREFIXES)


def process_libraries(maps_path: str = _MAPS, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """LD_PRELOAD of this process, the shared objects it has mapped, and those (other than libc and the loader)
    that define fsync, fdatasync, posix_fadvise or open (and their variants): `interposers`."""
    env = os.environ if environ is None else environ
    libs = mapped_libraries(maps_path)
    interposers = []
    for path in libs:
        if is_system_library(path):
            continue
        symbols = defined_functions(path)
        if symbols:
            interposers.append({"path": path, "symbols": symbols})
    return {
        "ld_preload": [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p],
        "recorded": bool(libs),
        "source": maps_path,
        "mapped_count": len(libs),
        "interposers": interposers,
        "watched": list(WATCHED),
        "method": "ELF .dynsym of each mapped shared object (defined, exported functions); libc and the loader "
                  "excluded",
    }


def snapshot_at_start() -> dict[str, Any]:
    """`process_libraries()` taken once, at the start of the run (later calls return the same snapshot)."""
    global _AT_START
    if _AT_START is None:
        _AT_START = process_libraries()
    return _AT_START
