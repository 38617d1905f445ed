"""Tests of qsched's recovery package (tests are laid out as the code is)."""
