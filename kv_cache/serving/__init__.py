"""The serving path's assembly: the cache tiers and their stores (tiers.py) and the one builder that
every benchmark opens its tiers and cache through (build.py)."""
