"""walkv's HTTP clients and the wire format they share with the server."""
