"""Coverage and bias of the sessions answer's estimator (kv_cache/metrics/slo_fit.py, the function
`kv-cache sessions` calls) on synthetic cells drawn from known p90-vs-sessions curves.

Each run builds a ladder as the tool does (coarse rungs 4, 8, 16; then up to 3 bisection rungs of the
first-miss bracket of the replications' mean log p90, until it is at most max(1, 10 %) wide, the rule of
kv_cache/benchmarks/sessions/answer.py), draws K replications of every rung: p90 = the true curve's value x
exp(sigma x z), z standard normal, independent per cell, with Poisson(30) returning turns behind it, and
runs ``estimate``. The truth is the session count where the true curve crosses the SLO (2 s).

With ``--replication-share F`` a share F of the noise's variance is a replication's, shared along the
ladder (replication r replays one sample of sessions at every rung: its p90s are all x exp(sigma sqrt(F)
u_r)), the rest the cell's own (sigma sqrt(1 - F)); the default 0 is independent cells. Several shares, comma
separated, print a table each.

    python3 benchmarks/slo_fit_coverage.py [--runs 200] [--boot 400] [--replication-share 0,0.8]

prints one line per case: ``curve=NAME sigma=S K=K coverage=C bias=B answered=A`` (coverage of the 95 %
interval over the answered runs; bias = mean estimate - truth, in sessions; answered = share of runs whose
crossing was interpolated, not censored). About 5-15 minutes a table on one core of the shared 2-core machine.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv_cache.metrics.slo_fit import Cell, estimate  # noqa: E402

SLO = 2.0
COARSE = (4, 8, 16)


def queueing(n: float) -> float:
    """An M/M/1-like p90: 0.5 s unloaded, climbing as 1 / (1 - n / 12); crosses 2 s at 9 sessions."""
    return 0.5 / max(1e-3, 1.0 - n / 12.0) if n < 12 else 500.0


def exponential(n: float) -> float:
    """p90 = 0.3 exp(n / 4): crosses 2 s at 4 ln(20 / 3) = 7.59 sessions."""
    return 0.3 * math.exp(n / 4.0)


def wiggly(n: float) -> float:
    """A rising power law, 0.4 (n / 4)^2 (2 s at 8.94 sessions), with a wiggle that makes it fall between
    ~4.5 and ~5.6 sessions: x (1 + 0.35 sin(2.2 n) exp(-((n - 5) / 1.6)^2)), negligible at the crossing."""
    return 0.4 * (n / 4.0) ** 2 * (1.0 + 0.35 * math.sin(2.2 * n) * math.exp(-(((n - 5.0) / 1.6) ** 2)))


CURVES: dict[str, Callable[[float], float]] = {"queueing": queueing, "exponential": exponential,
                                               "noisy_non_monotone": wiggly}


def truth(curve: Callable[[float], float]) -> float:
    """The largest session count at which the curve still meets the SLO, on a fine grid (then bisected)."""
    grid = np.linspace(1.0, 16.0, 15001)
    vals = np.array([curve(float(g)) for g in grid])
    i = int(np.flatnonzero(vals <= SLO)[-1])
    lo, hi = grid[i], grid[i + 1]
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if curve(mid) <= SLO else (lo, mid)
    return (lo + hi) / 2


def one_run(curve: Callable[[float], float], sigma: float, k: int, rng: np.random.Generator,
            n_boot: int, seed: int, share: float = 0.0) -> tuple[float | None, float | None, float | None, str]:
    cells: list[Cell] = []
    means: dict[int, float] = {}
    # a replication's own effect, the same at every rung (drawn only with a share: the default's stream is
    # the one the quoted table was measured with)
    effect = sigma * math.sqrt(share) * rng.standard_normal(k) if share else np.zeros(k)
    cell_sigma = sigma * math.sqrt(1.0 - share)

    def run_rung(n: int) -> None:
        logs = []
        for rep in range(k):
            p90 = curve(n) * math.exp(effect[rep] + cell_sigma * rng.standard_normal())
            cells.append(Cell(n, rep, p90, int(max(10, rng.poisson(30)))))
            logs.append(math.log(p90))
        means[n] = float(np.mean(logs))

    for n in COARSE:
        run_rung(n)
    for _ in range(3):  # the tool's bisection of the first-miss bracket
        pts = sorted(means.items())
        miss = [i for i, (_, m) in enumerate(pts) if m > math.log(SLO)]
        if not miss or miss[0] == 0:
            break
        lo, hi = pts[miss[0] - 1][0], pts[miss[0]][0]
        if hi - lo <= max(1, 0.1 * lo):
            break
        mid = (lo + hi) // 2
        if mid in means:
            break
        run_rung(mid)
    out, _ = estimate({"c": cells}, SLO, seed=seed, n_boot=n_boot)
    c = out["c"]
    return c.sessions, c.low, c.high, c.status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--boot", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replication-share", default="0",
                    help="share(s) of the noise variance that is a replication's, shared along the ladder "
                         "(comma-separated, each in [0, 1); default 0: independent cells)")
    args = ap.parse_args()
    try:
        shares = [float(x) for x in args.replication_share.split(",")]
    except ValueError:
        ap.error(f"--replication-share takes numbers in [0, 1), got {args.replication_share!r}")
    if not all(0.0 <= x < 1.0 for x in shares) or args.runs < 1 or args.boot < 10:
        ap.error("--replication-share takes numbers in [0, 1); --runs >= 1, --boot >= 10")
    t0 = time.monotonic()
    for share in shares:
        cases(args, share, t0)
    return 0


def cases(args: argparse.Namespace, share: float, t0: float) -> None:
    """One table: every curve, sigma and K at this replication share."""
    tag = f" share={share:g}" if share else ""
    for name, curve in CURVES.items():
        true_n = truth(curve)
        for sigma in (0.25, 0.5):
            for k in (3, 5):
                rng = np.random.default_rng([args.seed, int(sigma * 100), k, len(name)] + ([int(share * 100)] if share else []))
                hits, errs, answered = 0, [], 0
                for r in range(args.runs):
                    est, lo, hi, status = one_run(curve, sigma, k, rng, args.boot, seed=r, share=share)
                    if status != "interpolated":
                        continue
                    answered += 1
                    errs.append(est - true_n)
                    hits += lo <= true_n <= hi
                cov = hits / answered if answered else float("nan")
                bias = float(np.mean(errs)) if errs else float("nan")
                print(f"curve={name} sigma={sigma} K={k} coverage={cov:.3f} bias={bias:+.3f} "
                      f"answered={answered / args.runs:.3f}{tag}  (truth {true_n:.2f} sessions, {args.runs} runs, "
                      f"{time.monotonic() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
