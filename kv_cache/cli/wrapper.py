"""`mlperf_wrapper.py`: the per-rank entry the mlpstorage harness runs under mpirun.

Two interfaces are in use, both supported:
- current: `--rank-output-base DIR --rank-cache-base DIR --seed-base S [--config CFG]` followed by kv-cache
  flags (`--model --num-users --duration ...`);
- earlier: `--option {1,2,3} --seed S --base-output-dir DIR --cache-dir DIR [--config CFG]`, the option
  being a row of the Rules' table KVCache-1 (OPTIONS), with `--generation-mode none` in every option.

Either way the rank comes from the launcher's environment (OMPI_COMM_WORLD_RANK or PMI_RANK, no mpi4py
needed), the seed is base + rank, the results go to `<base>/rank_<N>/kvcache_results_<YYYYmmdd_HHMMSS>.json`
and the cache under `<cache>/rank_<N>/`. `--start-delay` / `--end-delay` (kv-cache flags, settings/run.py)
wait before / after the run: the MLPerf tool's 90 s (the Rules' settle time) by default here, 0 a flag away.

The kv-cache flags are each rank's own values, as the Rules define them (`--num-users` is per client): the
wrapper resolves them with `flags_per_rank`, so nothing is divided between the ranks (a plain `mpirun
kv-cache.py` takes them as totals instead); the host's memory budget is still shared by its ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from kv_cache.errors import ExitCode, KvCacheError, UsageError
from kv_cache.settings.run import MLPERF_SETTLE_S

__all__ = ["OPTIONS", "RankPlan", "main", "plan_rank"]

PROG = "mlperf_wrapper.py"

# The Rules' table KVCache-1: option -> kv-cache flags (every option: --generation-mode none, no GPU tier).
OPTIONS: dict[int, tuple[str, ...]] = {
    1: ("--model", "llama3.1-8b", "--num-users", "200", "--duration", "300", "--cpu-mem-gb", "0",
        "--max-concurrent-allocs", "16"),
    2: ("--model", "llama3.1-8b", "--num-users", "100", "--duration", "300", "--cpu-mem-gb", "4",
        "--max-concurrent-allocs", "16"),
    3: ("--model", "llama3.1-70b-instruct", "--num-users", "70", "--duration", "300", "--cpu-mem-gb", "0",
        "--max-concurrent-allocs", "4"),
}
_EVERY_OPTION = ("--gpu-mem-gb", "0", "--generation-mode", "none")
# Flags the wrapper sets itself for each rank; given among the kv-cache flags they would be ambiguous.
_OWNED = ("--output", "--cache-dir", "--seed")
# The wrapper's own defaults of kv-cache flags, before the flags given (which override them): the MLPerf
# tool's settle time before and after each run.
WRAPPER_DEFAULTS = ("--start-delay", f"{MLPERF_SETTLE_S:g}", "--end-delay", f"{MLPERF_SETTLE_S:g}")


@dataclass(frozen=True)
class RankPlan:
    """What one rank runs: its rank and world size, seed, paths and the kv-cache argv."""

    rank: int
    world_size: int
    seed: int
    output: str
    cache_dir: str
    argv: tuple[str, ...]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2 (as kv-cache's own parser)
        raise UsageError(" ".join(message.split()))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Per-rank kv-cache run for the mlpstorage harness (both interfaces).",
                allow_abbrev=False,  # a kv-cache flag is never taken for an abbreviated wrapper flag
                epilog="Other flags are passed to kv-cache.")
    p.add_argument("--rank-output-base", help="current: results go to DIR/rank_<N>/")
    p.add_argument("--rank-cache-base", help="current: the cache goes under DIR/rank_<N>/")
    p.add_argument("--seed-base", type=int, help="current: the rank's seed is S + rank")
    p.add_argument("--option", type=int, choices=sorted(OPTIONS), help="earlier: the Rules' KVCache-1 option")
    p.add_argument("--seed", type=int, help="earlier: the rank's seed is S + rank")
    p.add_argument("--base-output-dir", help="earlier: results go to DIR/rank_<N>/")
    p.add_argument("--cache-dir", help="earlier: the cache goes under DIR/rank_<N>/")
    p.add_argument("--config", help="config.yaml for kv-cache")
    return p


def env_rank(env: Mapping[str, str]) -> tuple[int, int]:
    """(rank, world size) from OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/SIZE; (0, 1) outside a launcher."""
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE")):
        if rank_var in env:
            try:
                rank, size = int(env[rank_var]), int(env.get(size_var, "1"))
            except ValueError:
                raise UsageError(f"{rank_var}={env[rank_var]!r} is not an integer") from None
            if rank < 0:
                raise UsageError(f"{rank_var}={rank} is negative")
            return rank, max(size, rank + 1)
    return 0, 1


def _check_unknown(rest: list[str], parser: argparse.ArgumentParser) -> None:
    """Every flag the wrapper passes on must be a kv-cache flag: anything else (an abbreviation such as
    `--opt`, a typo such as `--optoin`) is refused here, before "missing --option" could hide it, with a
    "did you mean" among the wrapper's and kv-cache's flags. Flags are never abbreviated."""
    from kv_cache.cli import build_parser as kv_parser  # noqa: PLC0415  (the package's own CLI)
    from kv_cache.cli import did_you_mean  # noqa: PLC0415

    kv_flags = set(kv_parser()._option_string_actions)
    wrapper_flags = [f for f in parser._option_string_actions if f.startswith("--")]
    for word in rest:
        name = word.split("=", 1)[0]
        if not name.startswith("--") or name in kv_flags:
            continue
        prefix_of = [f for f in wrapper_flags if f.startswith(name)]
        message = f"unrecognized arguments: {word}"
        hint = (f" (did you mean {prefix_of[0]}?)" if len(prefix_of) == 1
                else did_you_mean(message, [*wrapper_flags, *sorted(kv_flags)]))
        raise UsageError(message + hint + ("; flags are never abbreviated" if prefix_of else ""))


def plan_rank(argv: list[str], env: Mapping[str, str], now: datetime) -> RankPlan:
    """Wrapper flags + environment -> this rank's plan; UsageError (one line) for anything wrong."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    _check_unknown(rest, parser)
    for flag in _OWNED:
        if any(a == flag or a.startswith(flag + "=") for a in rest):
            raise UsageError(f"{flag} is set per rank by the wrapper; give its base instead")
    current = (args.rank_output_base, args.rank_cache_base, args.seed_base)
    earlier = (args.option, args.seed, args.base_output_dir, args.cache_dir)
    if any(v is not None for v in current) and any(v is not None for v in earlier):
        raise UsageError("mix of the two interfaces: use either --rank-output-base/--rank-cache-base/--seed-base "
                         "or --option/--seed/--base-output-dir/--cache-dir")
    if args.option is not None or any(v is not None for v in earlier):
        missing = [f for f, v in (("--option", args.option), ("--seed", args.seed),
                                  ("--base-output-dir", args.base_output_dir), ("--cache-dir", args.cache_dir))
                   if v is None]
        base_out, base_cache, seed_base = args.base_output_dir, args.cache_dir, args.seed
        flags = (*OPTIONS[args.option], *_EVERY_OPTION) if args.option is not None else ()
    else:
        missing = [f for f, v in (("--rank-output-base", args.rank_output_base),
                                  ("--rank-cache-base", args.rank_cache_base), ("--seed-base", args.seed_base))
                   if v is None]
        base_out, base_cache, seed_base, flags = args.rank_output_base, args.rank_cache_base, args.seed_base, ()
    if missing:
        raise UsageError(f"missing {', '.join(missing)}")
    rank, world = env_rank(env)
    out_dir = os.path.join(os.path.abspath(base_out), f"rank_{rank}")
    output = os.path.join(out_dir, f"kvcache_results_{now:%Y%m%d_%H%M%S}.json")
    cache_dir = os.path.join(os.path.abspath(base_cache), f"rank_{rank}")
    seed = seed_base + rank
    config = ("--config", args.config) if args.config else ()
    kv_argv = (*WRAPPER_DEFAULTS, *flags, *config, *rest, "--seed", str(seed), "--output", output,
               "--cache-dir", cache_dir)  # (the flags given come after WRAPPER_DEFAULTS: they win)
    return RankPlan(rank, world, seed, output, cache_dir, kv_argv)


def run_kv_cache(plan: RankPlan) -> int:
    """Run kv-cache with the plan's argv; the per-rank paths are the plan's (no `_rank<r>` suffixes)."""
    from kv_cache.cli import build_parser as kv_parser  # noqa: PLC0415  (the package's own CLI)
    from kv_cache.cli import run_resolved  # noqa: PLC0415
    from kv_cache.cli.resolve import resolve_run  # noqa: PLC0415

    argv = list(plan.argv)
    args = kv_parser().parse_args(argv)
    settings = resolve_run(args, argv, rank_paths=False, flags_per_rank=True)  # the Rules: values per client
    # validated first, created after: a refused flag leaves no rank_<N>/ behind. The cache dir is left to the
    # run: it removes the levels it created when it ends, so a rank's rank_<N>/ is not left behind empty
    os.makedirs(os.path.dirname(plan.output), exist_ok=True)
    stamp = os.path.basename(plan.output).removeprefix("kvcache_results_")
    merged = os.path.join(os.path.dirname(os.path.dirname(plan.output)), f"kvcache_merged_{stamp}")
    return run_resolved(dataclasses.replace(settings, merged_output=merged))  # rank 0 writes it under mpirun


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None,
         runner: Callable[[RankPlan], int] = run_kv_cache, now: datetime | None = None) -> int:
    """Entry point of mlperf_wrapper.py; returns the exit status (kv-cache's, or 2 for a usage error)."""
    from kv_cache.cli import exit_code_for, explain  # noqa: PLC0415
    from kv_cache.cli.exits import after_output  # noqa: PLC0415
    from kv_cache.cli.stdout import tolerant_stdio  # noqa: PLC0415

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        plan = plan_rank(argv, os.environ if env is None else env, now or datetime.now())
        logging.getLogger("kv_cache").info("rank %d/%d: seed %d, output %s, cache %s", plan.rank,
                                           plan.world_size, plan.seed, plan.output, plan.cache_dir)
        with tolerant_stdio() as stdio:  # a gone stdout reader stops nothing; 141 instead of 0 (cli/exits.py)
            code = after_output(runner(plan), stdio.stdout_closed)
        return code
    except SystemExit as exc:  # kv-cache's argparse: --help (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except (KeyboardInterrupt, KvCacheError) as exc:
        code = exit_code_for(exc) or ExitCode.INTERNAL
        sys.stderr.write(f"{PROG}: {'interrupted' if code == ExitCode.INTERRUPTED else 'error: ' + explain(exc)}\n")
        return int(code)
