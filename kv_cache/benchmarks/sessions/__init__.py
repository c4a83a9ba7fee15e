"""The sessions ladder (`kv-cache sessions`): its build, rung loop and results.

run.py             the sub-command end to end: settings -> session supply -> ladder of rungs -> results -> outputs
ladder.py          one rung = session slots on engine replicas, measured; rung after rung
session_slots.py   a ladder slot as a closed-loop user replaying session scripts
steady_state.py    `--steady-state`: start a rung warm, and detect when its warm-up ended
rung_results.py    one rung's results and the checks on them
ladder_summary.py  replications merged per cell, the work-equivalence control, effective capacity
"""
