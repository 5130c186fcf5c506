"""``seqserve serve --workers N``: N front-end worker processes in front of one engine process
(docs/architecture.md, "Worker processes")."""
