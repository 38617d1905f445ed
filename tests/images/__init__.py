"""Tests of qsched's images package (tests are laid out as the code is)."""
