"""In-process studies (no network): each is ``python -m bench.studies.<name>``; see bench/studies/."""
