"""Tests of qsched's ledger package (tests are laid out as the code is)."""
