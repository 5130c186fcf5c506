"""Tests of the documentation: its examples run as written, its local links resolve."""
