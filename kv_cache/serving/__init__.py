"""The serving path: the multi-tier cache that decides where each entry lives (cache.py), the cache tiers
and their stores (tiers.py), the one builder that every benchmark opens its tiers and cache through
(build.py), and the modelled inference engine (engine/)."""
