"""Shared machinery of both benchmarks: when things happen, on what, across how many ranks.

events.py       the event loop: timer heap, completion queue fed by executors, dispatch table of handlers
closed_loop.py  closed-loop users on that loop (think, then ask again); shared by both benchmarks
pool.py         the one I/O worker pool, with a distinct buffer stream per job kind
autoscale.py    load shapes at every monitor tick; shapes/ the registry of shapes (constant, autoscaler)
group.py        the ranks of one run (mpirun, --processes): barriers around the window, gathering of results
observe.py      how the loop tells listeners what happens, without knowing who listens
error_policy.py the one storage-error policy of a run
"""
