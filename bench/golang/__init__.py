"""Go programs of the bench (grpc-go clients), built offline from Debian's Go packages."""
