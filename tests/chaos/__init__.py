"""Tests of qsched's chaos package (tests are laid out as the code is)."""
