"""The heartbeat path on the supervisor side: the wire format, the channel secret, the live table and its UDP server."""
