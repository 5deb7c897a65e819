"""One-off measurements of the server: start-up time, bytes on the wire, the job cost's weights."""
