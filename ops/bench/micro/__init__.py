"""``kvroute bench micro <name>``: in-process costs measured with ``harness.micro``."""
