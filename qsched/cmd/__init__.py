"""Console entry points: thin commands over the qsched library."""
