"""Tests of qsched's compute package (tests are laid out as the code is)."""
