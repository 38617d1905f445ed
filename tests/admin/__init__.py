"""Tests of qsched's admin package (tests are laid out as the code is)."""
