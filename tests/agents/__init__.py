"""Tests of the compute agent (agents/) (tests are laid out as the code is)."""
