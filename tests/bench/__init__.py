"""Tests of qsched's bench package (tests are laid out as the code is)."""
