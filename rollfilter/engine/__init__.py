"""The engine: the one nursery and what it calls to send, route, group and count rollouts."""
