"""Focused studies (most in-process, a few against a spawned server): each is
``python -m bench.studies.<name>``; figures in bench/docs/."""
