"""Tests of qsched's notifications package (tests are laid out as the code is)."""
