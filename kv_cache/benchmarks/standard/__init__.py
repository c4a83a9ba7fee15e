"""The standard (MLPerf-compatible) run: its build, loop and outputs.

run.py          one run end to end: settings -> workload -> tiers and cache -> driver -> results -> outputs
processes.py    `--processes N`: N worker processes on one host, merged into one document
setup.py        the driver's part of the settings: I/O concurrency, scheduler options, phases before the window
scheduler.py    the Driver's handlers (wake, trace, arrive, complete, monitor) on the core's event loop
execute.py      one request plan's cache operations, and what each hit means for the workload
phases.py       preconditioning, pre-population, RAG ingestion on the worker pool
outputs.py      the results JSON, console report, spreadsheet and merged document of a finished run
"""
