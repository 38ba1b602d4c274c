"""``kvroute bench overhead``: kvroute in front of an engine against the engine's own server."""
