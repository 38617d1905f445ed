"""Virt drivers: one interface (base.py), one module per technology."""
