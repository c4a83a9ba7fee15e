"""Sessions-held mode: human-paced multi-turn sessions replayed closed-loop against a modelled inference
engine per GPU (HBM KV capacity, prefix cache, continuous batching, roofline compute) with real storage
I/O for the offload tiers.

Building blocks (import them from their modules; this package imports nothing, so that ``kv_cache.config``
can use ``kv_cache.sessions.gpu`` without an import cycle):

- ``kv_cache.sessions.gpu``: GPU datasheet specs and the roofline cost model of one engine iteration;
- ``kv_cache.sessions.stats``: confidence intervals (t, batch means, rates, ratios, bootstrap);
- ``kv_cache.sessions.scripts``: session scripts (generator, trace adapter, pace transform, turn classes).
"""
