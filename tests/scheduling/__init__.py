"""Tests of qsched's scheduling package (tests are laid out as the code is)."""
