"""When things happen: one scheduler core and what runs on it.

events.py       the core: timer heap, completion queue fed by executors, dispatch table of handlers
closed_loop.py  closed-loop users on that core (think, then ask again); shared by both run kinds
scheduler.py    the standard run: Driver's handlers (wake, trace, arrive, complete, monitor)
execute.py      one request plan's cache operations, and what each hit means for the workload
pool.py         the one I/O worker pool, with a distinct buffer stream per job kind
autoscale.py    load shapes: constant, autoscaler (qos / capacity)
ladder.py       `kv-cache sessions`: one rung = session slots on engine replicas, measured
session_slots.py  a ladder slot as a closed-loop user replaying session scripts
phases.py       preconditioning, pre-population, RAG ingestion on the worker pool
"""
