"""Tests of qsched's bus package (tests are laid out as the code is)."""
