"""``kvroute bench calibrate``: the sim engine emulator fitted to a real engine."""
