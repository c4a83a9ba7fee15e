"""What `kv-cache sessions` prints while it climbs: the banner (model, GPU, HBM, rungs, the engine model's
line), each rung's line with its ETA as it runs, a grid cell's heading, how a ladder stopped early, and
after the document is written, its tables and where it went."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from kv_cache import __version__
from kv_cache.render.console import integrity_line
from kv_cache.render.sessions import engine_line, print_grid, print_table
from kv_cache.results.sessions_document import engine_calibration, pace_transform
from kv_cache.results.write import Written
from kv_cache.settings.sessions import LadderSettings, SessionsSettings

__all__ = ["RungProgress", "ladder_ended", "print_banner", "print_grid_heading", "print_written", "rung_eta"]


def print_banner(ls: LadderSettings, s: SessionsSettings, out: TextIO) -> None:
    """The lines before a cell's first rung: what runs, on what, and the engine model's error."""
    cap_blocks = ls.hbm_capacity_blocks()
    out.write(
        f"kv-cache {__version__} sessions: {ls.model_name} on {ls.num_gpus} x {ls.gpu_name} "
        f"(HBM for KV: {cap_blocks} blocks of {ls.block_tokens} tokens = "
        f"{cap_blocks * ls.block_tokens:,} tokens per replica), "
        f"rungs {f'auto from {s.ladder_auto_start}' if s.ladder_auto_start else list(s.ladder)}, tiers {list(s.tiers)}, "
        f"window {ls.window_s:g} s + warm-up {ls.warmup_s:g} s each\n"
    )
    out.write(engine_line(engine_calibration(ls)) + "\n")
    if ls.pace is not None and ls.pace.mode != "trace":
        out.write(f"Pace transform: {pace_transform(ls.pace, str(ls.pace), ls.seed)['description']}\n")
    if ls.dram_write_through:
        out.write("DRAM offload: write-through (every computed block stored on completion, as vLLM's "
                  "offloading connector)\n")


def rung_eta(done: int, total: int, elapsed_s: float, ls: LadderSettings) -> str:
    """Time left for the whole ladder: the finished rungs' mean time per rung, or before the first one
    the nominal warm-up + window, times the rungs left (this one included)."""
    per_rung = elapsed_s / done if done else ls.warmup_s + ls.window_s
    left = per_rung * (total - done)
    return f"ETA {int(left) // 60}m{int(left) % 60:02d}s" + ("" if done else " (nominal)")


class RungProgress:
    """'rung i of n' with an ETA for the console (n unknown on an auto ladder: 'rung i' and elapsed time), and
    each rung's line: `running` when it starts, its figures once the next one starts or the cell ends."""

    def __init__(self, ls: LadderSettings, total: int | None) -> None:
        self.ls, self.total, self.done, self.started = ls, total, 0, time.monotonic()
        self.pending = ""  # the last finished replication's figures, ending its line

    def label(self) -> str:
        elapsed = time.monotonic() - self.started
        if self.total is None:
            return f"[rung {self.done + 1}, {int(elapsed) // 60}m{int(elapsed) % 60:02d}s so far]"
        return f"[rung {self.done + 1} of {self.total}, {rung_eta(self.done, self.total, elapsed, self.ls)}]"

    def running(self, out: TextIO, tier: str, n: int, k: int, replications: int, window_s: float,
                pilot: dict[str, Any] | None = None) -> None:
        """A run's start; a window other than --window says why: 3 planned cycles, or the `pilot` left out."""
        why = (f"the pilot had {pilot['returning_turns']} returning turns, under {pilot['wanted_returning_turns']} "
               f"({pilot['needed_returning_turns']} needed per replication): all again" if pilot else "3 planned cycles")
        out.write(self.pending + f"  {self.label()} running {tier:<13} {n:>5} sessions"
                  + (f" (replication {k + 1})" if replications > 1 else "")
                  + (f", window {window_s:.0f} s ({why})" if window_s != self.ls.window_s and k == 0 else "")
                  + " ...")
        out.flush()
        self.pending = ""

    def pilot(self) -> None:
        """A pilot was left out and its replication runs again: one more run than the ladder counted."""
        if self.total is not None:
            self.total += 1

    def measured(self, result: dict[str, Any]) -> None:
        self.done += 1
        t = result["throughput_tokens_per_s_per_gpu"]
        self.pending = f" {t['estimate']:10.1f} tok/s/GPU, {result['completed_turns']} turns\n"

    def cell_done(self, out: TextIO) -> None:
        out.write(self.pending)
        out.flush()
        self.pending = ""

    @staticmethod
    def stopped(out: TextIO) -> None:
        out.write(" stopped by a storage error\n")


def print_grid_heading(i: int, cells: int, ls: LadderSettings, out: TextIO) -> None:
    out.write(f"\n=== grid cell {i} of {cells}: {ls.model_name} on {ls.num_gpus} x {ls.gpu_name} ===\n")


def ladder_ended(rungs: int, storage_error: str | None = None, unfinished: dict[str, Any] | None = None) -> None:
    """On stderr: the ladder stopped early (interrupted, or by a storage error), and its rungs are written;
    an interrupt inside a rung says what of it is left out (its finished replications, a pilot)."""
    lost = ""
    if unfinished:
        lost = (f" ({unfinished['tiers']} at {unfinished['sessions']} sessions left out: "
                f"{unfinished['replications_finished']} of {unfinished['replications']} replications finished"
                + (", after a pilot" if unfinished.get("evidence_pilot") else "") + "; unfinished_rung)")
    sys.stderr.write(f"kv-cache sessions: stopped by a storage error: {storage_error}\n" if storage_error is not None
                     else f"kv-cache sessions: interrupted after {rungs} rung(s){lost}; writing them\n")


def print_written(results: dict[str, Any], complete: bool, output: str, written: Written, out: TextIO) -> None:
    """After the document is written: the table (one per grid cell) of a ladder that ran to its end, the
    integrity verdict when it is not ok (an LD_PRELOAD shim; always in the JSON), and where it all went."""
    if complete:
        if results.get("grid"):
            print_grid(results["grid"], results["method"], out)
        else:
            print_table(results, out)
    if results["integrity"]["verdict"] != "ok":
        out.write("\n" + "\n".join(integrity_line(results)) + "\n")
    if written.kept_as:
        out.write(f"\nNote: an earlier {output} was kept as {written.kept_as}\n")
    if written.error:
        sys.stderr.write(f"kv-cache sessions: could not write the results to {written.error}; "
                         f"they are in {written.path}\n")
    out.write(f"\nResults written to {written.path}\n")
