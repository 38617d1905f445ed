"""Tests of qsched's cells package (tests are laid out as the code is)."""
