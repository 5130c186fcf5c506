"""KServe v2 over HTTP: the routes, request bodies, the JSON and binary codec, the status table."""
