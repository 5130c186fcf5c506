"""Protocol servers: HTTP/1.1 and HTTP/2 connections, gRPC calls (no KServe here)."""
