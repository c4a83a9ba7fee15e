"""Command line: `kv-cache [run] FLAGS` (the MLPerf tool's flags plus ours) and `kv-cache sessions FLAGS`.

The only place that knows flag names and exit codes. Errors are one line on stderr,
`kv-cache: error: <message>` (`kv-cache sessions: error: ...` for that command), and exit status 2:
argparse problems (unknown flag, bad type or choice), flag values out of range, config-file problems,
an unknown model, an unsafe --cache-dir, unreadable trace files, and flags whose feature this version
does not implement yet. An error raised below about a setting gets that setting's flag in front.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from kv_cache import __version__
from kv_cache.cli import settle
from kv_cache.cli.audit import add_audit_flags, audit_command
from kv_cache.cli.catalogue_cmd import add_catalogue_flags, catalogue_command
from kv_cache.cli.compare_cmd import add_compare_flags, compare_command
from kv_cache.cli.exits import EXIT_CODES, after_output, exit_code_for, exit_status
from kv_cache.cli.flags import add_run_flags, add_sessions_flags
from kv_cache.cli.merge import add_merge_flags, merge_command
from kv_cache.cli.report_cmd import (
    add_plots_flag,
    add_report_flags,
    check_plots_dir,
    plots_after_run,
    report_command,
)
from kv_cache.cli.resolve import resolve_run
from kv_cache.cli.sessions import SessionsSettings, resolve_sessions
from kv_cache.cli.stdout import StdStreams, install, tolerant_stdio
from kv_cache.core.group import abort_peers, leave_after_lost_ranks
from kv_cache.errors import ExitCode, KvCacheError, UsageError
from kv_cache.settings.run import RunSettings
from kv_cache.settings.validation import advisories

__all__ = ["COMMANDS", "EXIT_CODES", "build_parser", "configure_logging", "exit_code_for", "explain", "main",
           "parse_settings", "parse_sessions_settings", "run_resolved", "setup_rank"]

PROG = "kv-cache"
LOG_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"

logger = logging.getLogger(__name__)


class HELP_FORMAT(argparse.HelpFormatter):  # noqa: N801  (used as a formatter_class value)
    """--help shows each flag's default, unless its help text already names it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text.lower()
                or action.default in (None, argparse.SUPPRESS) or action.nargs == 0 and action.default is False):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump): `<prog>: error: <message>`, exit status 2; no flag
    abbreviations (a prefix such as `--windo` is an error, never taken for `--window`), and a "did you
    mean" for a flag it does not know."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False  # every parser, sub-commands included
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        hint = did_you_mean(text, self._option_string_actions)
        sys.stderr.write(f"{self.prog}: error: {text}{hint}\n")
        sys.exit(ExitCode.USAGE)


_UNRECOGNIZED = "unrecognized arguments: "
MAX_PREFIX_GUESSES = 3  # a typed flag that starts more known flags than this gets no prefix guess


def did_you_mean(message: str, known: Iterable[str]) -> str:
    """` (did you mean --window?)` for the first unknown flag of an argparse "unrecognized arguments"
    message that is the start of known flags (`--dur`: --duration; up to MAX_PREFIX_GUESSES of them named)
    or close to one (difflib); "" otherwise. The flag itself is still refused: no abbreviations."""
    if not message.startswith(_UNRECOGNIZED):
        return ""
    flags = sorted({f for f in known if f.startswith("--")})
    for word in message[len(_UNRECOGNIZED):].split():
        if not word.startswith("--"):
            continue
        typed = word.split("=", 1)[0]
        longer = [f for f in flags if f.startswith(typed) and f != typed] if len(typed) > 3 else []
        if 0 < len(longer) <= MAX_PREFIX_GUESSES:
            return f" (did you mean {longer[0]}?)" if len(longer) == 1 else \
                f" (did you mean one of {', '.join(longer)}?)"
        close = difflib.get_close_matches(typed, flags, n=1, cutoff=0.75)
        if close:
            return f" (did you mean {close[0]}?)"
    return ""


@dataclass(frozen=True)
class Command:
    """A sub-command: its parser's text and flags, and what it does with the parsed flags."""

    prog: str
    summary: str
    description: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace, list[str]], int]
    epilog: str | None = None


def _run_command(args: argparse.Namespace, argv: list[str]) -> int:
    settings = resolve_run(args, argv)
    check_plots_dir(args.plots)
    code = run_resolved(settings)
    plots_after_run(settings.outputs.output, args.plots)
    return code


def run_resolved(settings: RunSettings, sleep: Callable[[float], None] = time.sleep) -> int:
    """Run the benchmark with resolved settings (logging set up, advisories logged), between the settle
    waits (--start-delay / --end-delay: cli/settle.py); the exit status."""
    configure_logging(settings.outputs.log_level)
    if settings.config_path:
        logger.info("Loaded configuration from %s", settings.config_path)
    for message in advisories(settings):
        logger.warning(message)
    return settle.around(lambda: _run(settings), settings.driver.start_delay, settings.driver.end_delay,
                         sleep=sleep)


def _run(settings: RunSettings) -> int:
    if settings.driver.processes > 1:
        from kv_cache.benchmarks.standard.processes import run_processes  # noqa: PLC0415

        return int(exit_status(run_processes(settings, sys.stdout, setup_logging=setup_rank)))
    from kv_cache.benchmarks.standard.run import run_benchmark  # noqa: PLC0415  (heavy; not needed for --help or errors)

    return int(exit_status(run_benchmark(settings)))


def _sessions_command(args: argparse.Namespace, argv: list[str]) -> int:
    settings = resolve_sessions(args, argv)
    check_plots_dir(args.plots)
    logging.basicConfig(level=getattr(logging, settings.log_level), format=LOG_FORMAT)
    from kv_cache.benchmarks.sessions.run import run_sessions  # noqa: PLC0415

    code = int(exit_status(run_sessions(settings)))
    plots_after_run(settings.output, args.plots)
    return code


def _with_plots_flag(add_flags: Callable[[argparse.ArgumentParser], None]) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        add_flags(p)
        add_plots_flag(p)
    return add


# Sub-commands; `run` is the default when the first argument is not one of these names.
COMMANDS: dict[str, Command] = {
    "run": Command(
        prog=PROG,
        summary="run the benchmark (the default command)",
        description="Integrated Multi-User KV Cache Benchmark (MLPerf Storage v3 compatible).",
        epilog="Commands (each has its own --help, e.g. kv-cache sessions --help): run (the default); "
               "sessions (sessions held: modelled GPUs, concurrency ladder, real offload I/O); merge (per-rank "
               "results of one run into one document); report (a saved result's report and plots); compare "
               "(results side by side, with their storage, plots and JSON); audit (an integrity verdict of "
               "results, ours or the MLPerf tool's); catalogue (what the registries hold: storage backends, "
               "trace formats, GPU specs, metrics, load shapes)",
        add_flags=_with_plots_flag(add_run_flags),
        handler=_run_command,
    ),
    "sessions": Command(
        prog=f"{PROG} sessions",
        summary="how many concurrent sessions the GPUs hold with this storage tier behind them",
        description="`kv-cache sessions`: how many concurrent sessions do my GPUs hold with this storage "
                    "tier behind them?",
        add_flags=_with_plots_flag(add_sessions_flags),
        handler=_sessions_command,
    ),
    "merge": Command(
        prog=f"{PROG} merge",
        summary="merge per-rank results (mpirun, --processes, the mlpstorage harness's rank_<N>/ layout)",
        description="`kv-cache merge DIR|FILES`: one results document from per-rank documents: summed totals, "
                    "bandwidth over the common window, exact percentiles of the merged samples, a per-rank table.",
        add_flags=add_merge_flags,
        handler=merge_command,
    ),
    "report": Command(
        prog=f"{PROG} report",
        summary="reprint a saved result's report, and draw its plots with --plots DIR",
        description="`kv-cache report RESULT.json [--plots DIR]`: the report of a saved results file, and "
                    "optionally PNG plots and an HTML page.",
        add_flags=add_report_flags,
        handler=report_command,
    ),
    "compare": Command(
        prog=f"{PROG} compare",
        summary="key metrics of two or more results side by side, with ratios and 95 % CIs",
        description="`kv-cache compare A.json B.json ...`: checks that the workloads match, then shows the key "
                    "metrics side by side with ratios to A and 95 % confidence intervals from sub-windows.",
        add_flags=add_compare_flags,
        handler=compare_command,
    ),
    "audit": Command(
        prog=f"{PROG} audit",
        summary="integrity verdict (ok / suspect / invalid) of results, ours or the MLPerf tool's, with reasons",
        description="`kv-cache audit PATH...`: can these storage figures be what the storage did? Impossible "
                    "device times, I/O counted outside the window (with the corrected bandwidth), preloaded "
                    "libraries, page-cache service, I/O mode. PATH: a result, an MLPerf-tool rank file or a run "
                    "directory.",
        add_flags=add_audit_flags,
        handler=audit_command,
    ),
    "catalogue": Command(
        prog=f"{PROG} catalogue",
        summary="what the registries hold: storage backends, trace formats, GPU specs, metrics, load shapes",
        description="`kv-cache catalogue [SECTION ...] [--json]`: the entries of each registry (storage "
                    "backends, trace formats, GPU specs, output metrics, load shapes), read from the registries "
                    "themselves, so an entry added as a module is listed without any other change.",
        add_flags=add_catalogue_flags,
        handler=catalogue_command,
    ),
}
DEFAULT_COMMAND = "run"


def build_parser(command: str = DEFAULT_COMMAND) -> argparse.ArgumentParser:
    """The parser of one sub-command on its own (`run`: every MLPerf flag, defaults from RunSettings)."""
    cmd = COMMANDS[command]
    parser = _Parser(prog=cmd.prog, description=cmd.description, epilog=cmd.epilog, formatter_class=HELP_FORMAT)
    cmd.add_flags(parser)
    return parser


def build_main_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """`kv-cache COMMAND ...` with one sub-parser per command (returned too, to report their errors)."""
    top = _Parser(prog=PROG, description=COMMANDS[DEFAULT_COMMAND].description)
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parsers = {}
    for name, cmd in COMMANDS.items():
        parsers[name] = sub.add_parser(name, prog=cmd.prog, help=cmd.summary, description=cmd.description,
                                       epilog=cmd.epilog, formatter_class=HELP_FORMAT)
        cmd.add_flags(parsers[name])
    return top, parsers


def split_command(argv: list[str]) -> tuple[str, list[str]]:
    """(command, its arguments); no command name first means `run` (every flag starts with a dash)."""
    if argv and argv[0] in COMMANDS:
        return argv[0], argv[1:]
    if argv and not argv[0].startswith("-"):
        raise UsageError(f"unknown command '{argv[0]}' (choose from {', '.join(COMMANDS)})")
    return DEFAULT_COMMAND, argv


def parse_command(argv: list[str]) -> tuple[str, argparse.Namespace, list[str]]:
    """Parse `argv` with the argparse sub-commands; an argparse problem exits (SystemExit) after one line."""
    command, rest = split_command(argv)
    top, parsers = build_main_parser()
    args, extras = top.parse_known_args([command, *rest])
    if extras:  # reported by the sub-command's parser, under its own name
        parsers[command].error(f"unrecognized arguments: {' '.join(extras)}")
    return command, args, rest


def explain(exc: BaseException) -> str:
    """The one-line message of an error, with the flag of the setting it is about in front."""
    text = " ".join(str(exc).split())
    setting = getattr(exc, "setting", None)
    flag = _flag_of(setting) if setting else None
    return f"{flag} {text}" if flag else text


def _flag_of(setting: str) -> str | None:
    for action in build_parser()._actions:
        if action.dest == setting and action.option_strings:
            return action.option_strings[0]
    return None


def parse_settings(argv: list[str] | None = None) -> RunSettings:
    """Parse, load the config, validate, resolve the model: the run's immutable settings.

    Raises UsageError (one line, naming the flag) for anything wrong; argparse problems exit 2 after
    one stderr line. Trace files are not opened here (the run opens them first thing).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    return _with_flag_names(resolve_run, args, argv)


def parse_sessions_settings(argv: list[str]) -> SessionsSettings:
    """`kv-cache sessions` flags -> its settings; UsageError (one line) for anything wrong."""
    args = build_parser("sessions").parse_args(argv)
    return _with_flag_names(resolve_sessions, args, argv)


def _with_flag_names(resolve, args: argparse.Namespace, argv: list[str]):
    try:
        return resolve(args, argv)
    except UsageError as exc:
        if getattr(exc, "setting", None):
            raise UsageError(explain(exc)) from None
        raise


def setup_rank(level: str) -> None:
    """First thing in a process of --processes (spawned: nothing of the parent's set-up is there): stdout
    and stderr tolerant of a gone reader, for the process's life, then the logging."""
    install()
    configure_logging(level)


def configure_logging(level: str) -> None:
    """The MLPerf tool's log format, on stderr; the level applies to the `kv_cache` loggers."""
    numeric = getattr(logging, level)
    logging.basicConfig(level=numeric, format=LOG_FORMAT, datefmt=LOG_DATEFMT)
    logging.getLogger("kv_cache").setLevel(numeric)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `kv-cache`, `mlperf-kv-cache` and kv-cache.py; returns the exit status.

    stdout and stderr are tolerant of a gone reader meanwhile (cli/stdout.py): `kv-cache ... | head` runs
    to its end, writes every file, and a command that would end 0 ends 141 (exits.after_output)."""
    with tolerant_stdio() as stdio:
        code = _main(list(sys.argv[1:] if argv is None else argv), stdio)
    leave_after_lost_ranks(code)  # a survivor of a lost MPI rank exits without MPI_Finalize (it can hang)
    return code


def _main(argv: list[str], stdio: StdStreams) -> int:
    prog = PROG
    try:
        command, args, rest = parse_command(argv)
        prog = COMMANDS[command].prog
        code = COMMANDS[command].handler(args, rest)
        return after_output(code, stdio.stdout_closed)
    except SystemExit as exc:  # argparse: --help / --version (0) or a usage error (2, already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except (KeyboardInterrupt, KvCacheError) as exc:
        code = exit_code_for(exc) or ExitCode.INTERNAL
        if code == ExitCode.INTERRUPTED:
            sys.stderr.write(f"{prog}: interrupted\n")
        else:
            sys.stderr.write(f"{prog}: error: {explain(exc)}\n")
            sys.stderr.flush()
            abort_peers(int(code))  # under mpirun: end the other ranks too, none waits for this one
        return int(code)
    except BrokenPipeError:  # output that went around the tolerant streams: the launcher ends quietly (141)
        raise
    except Exception as exc:  # a bug, not bad input: the traceback, and a status of its own (never 2)
        logger.exception("internal error")
        sys.stderr.write(f"{prog}: internal error: {type(exc).__name__}: {exc} (a bug; the traceback is above)\n")
        sys.stderr.flush()
        abort_peers(int(ExitCode.INTERNAL))
        return int(ExitCode.INTERNAL)
