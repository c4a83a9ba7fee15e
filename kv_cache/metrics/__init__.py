"""What was measured: the run recorder and the one statistics module."""
