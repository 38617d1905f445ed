"""Tests of qsched's api package (tests are laid out as the code is)."""
