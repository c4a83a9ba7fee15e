"""The sessions engine's batching rule run on modelled time alone: a closed loop of requests through one
replica, for comparing the roofline with published end-to-end throughputs (serving/engine/calibration.py).

It applies the rule of ``replica.Replica`` without threads, I/O or a prefix cache (no request shares a
prefix, as in a throughput benchmark):

- a request is admitted when fewer than ``concurrency`` run and HBM can hold its whole final context
  (input + output tokens, ``roofline.hbm_kv_capacity_tokens``), first come first served;
- every iteration prefills up to ``chunk_tokens`` new tokens of the admitted requests in arrival order and
  advances every decoding request by one token, and lasts ``roofline.iteration_seconds`` of that batch;
- prefill emits the first output token (its TTFT: the end of the iteration that finished its prefill less
  its admission, as a client holding ``concurrency`` requests in flight times it); the request then decodes its other ``output - 1`` tokens, one per
  iteration, its context (input + tokens so far) read every step;
- a request that completes frees its slot and its HBM, and the next one is admitted.

Pure function, deterministic; the time is the sum of the iterations' roofline times.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kv_cache.serving.engine import roofline

if TYPE_CHECKING:  # pragma: no cover
    from kv_cache.specs import GPUSpec
    from kv_cache.specs.models import ModelConfig

__all__ = ["ClosedLoopResult", "closed_loop"]


@dataclass(frozen=True)
class ClosedLoopResult:
    """What one closed-loop run produced, on modelled time."""

    output_tokens_per_s: float  # output tokens / seconds, over the measured span
    seconds: float  # modelled seconds of the measured span
    iterations: int  # engine iterations of the whole run
    max_running: int  # most requests that ran at once (the concurrency HBM allowed)
    ttfts_s: tuple[float, ...] = ()  # per request, in completion-of-prefill order: first token - admission


def _check(lengths: Sequence[tuple[int, int]], concurrency: int, chunk_tokens: int, skip: int, capacity: int) -> None:
    if concurrency < 1 or chunk_tokens < 1:
        raise ValueError(f"concurrency and chunk_tokens must be >= 1, got {concurrency}, {chunk_tokens}")
    if not lengths or any(i < 1 or o < 1 for i, o in lengths) or not 0 <= 2 * skip < len(lengths):
        raise ValueError("closed_loop needs requests of >= 1 input and output token, and 2 x skip < their count")
    if max(i + o for i, o in lengths) > capacity:
        raise ValueError(f"a request's final context exceeds HBM's {capacity} KV tokens")


def _chunk(prefill: deque[list[int]], chunk_tokens: int) -> list[tuple[list[int], int]]:
    """This iteration's prefill chunk: up to ``chunk_tokens`` new tokens of the admitted requests, in
    arrival order, as (item, tokens) pairs."""
    chunk, budget = [], chunk_tokens
    for item in prefill:
        if budget <= 0:
            break
        n = min(item[1], budget)
        chunk.append((item, n))
        budget -= n
    return chunk


def closed_loop(
    gpu: GPUSpec,
    eff: roofline.Efficiency,
    model: ModelConfig,
    lengths: Sequence[tuple[int, int]],
    concurrency: int,
    chunk_tokens: int,
    tp: int = 1,
    skip: int = 0,
) -> ClosedLoopResult:
    """Run the requests ``lengths`` (input tokens, output tokens each; all queued at time 0) through one
    replica at most ``concurrency`` at a time.

    The measured span runs from the completion of the ``skip``-th request (time 0 when 0) to the last
    completion but ``skip`` (so ``skip`` > 0 leaves out the start-up ramp and the draining tail, for a
    benchmark whose run is far longer than one turn of its batch); its output tokens are those of the
    requests that completed within it.
    """
    capacity = roofline.hbm_kv_capacity_tokens(gpu, eff, model, tp)
    _check(lengths, concurrency, chunk_tokens, skip, capacity)
    pending = deque(range(len(lengths)))
    prefill: deque[list[int]] = deque()  # [request, tokens left, tokens done]
    decoding: list[tuple[int, int]] = []  # heap of (iteration it completes at, request)
    reserved = running = max_running = iterations = 0
    context = 0  # decoding requests' contexts, summed (input + tokens generated so far)
    now = start = end = 0.0
    completed = produced = 0
    last = len(lengths) - skip
    admitted_at: dict[int, float] = {}
    ttfts: list[float] = []

    def complete(req: int) -> None:
        nonlocal reserved, running, completed, produced, start, end
        i, o = lengths[req]
        reserved -= i + o
        running -= 1
        completed += 1
        if completed == skip:
            start = now
        elif skip < completed <= last:
            produced += o
            end = now

    while completed < len(lengths):
        while pending and running < concurrency and reserved + sum(lengths[pending[0]]) <= capacity:
            req = pending.popleft()
            admitted_at[req] = now
            reserved += sum(lengths[req])
            running += 1
            prefill.append([req, lengths[req][0], 0])
        max_running = max(max_running, running)
        chunk = _chunk(prefill, chunk_tokens)
        batch = len(decoding)
        now += roofline.iteration_seconds(gpu, eff, model, [(n, item[2]) for item, n in chunk], batch, context, tp)
        iterations += 1
        context += batch  # each decoding request read its context and grew by one token
        while decoding and decoding[0][0] == iterations:
            req = heapq.heappop(decoding)[1]
            context -= sum(lengths[req])
            complete(req)
        for item, n in chunk:
            item[1] -= n
            item[2] += n
            if item[1] == 0:
                prefill.popleft()
                req = item[0]
                ttfts.append(now - admitted_at[req])
                i, o = lengths[req]
                if o > 1:
                    heapq.heappush(decoding, (iterations + o - 1, req))
                    context += i + 1
                else:
                    complete(req)
    seconds = end - start
    return ClosedLoopResult(produced / seconds if seconds > 0 else 0.0, seconds, iterations, max_running,
                            tuple(ttfts))
