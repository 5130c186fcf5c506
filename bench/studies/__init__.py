"""In-process studies (no network): each is ``python -m bench.studies.<name>``; figures in bench/docs/."""
