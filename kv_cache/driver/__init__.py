"""When things happen: the scheduler, its load shapes (autoscaler, sessions ladder) and the run phases."""
