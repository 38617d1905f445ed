"""qsched: an O(1) scheduler for OpenStack-style clouds."""

__version__ = "0.1.0"
