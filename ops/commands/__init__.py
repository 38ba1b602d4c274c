"""``kvroute keys`` and ``kvroute status``: the operator commands kept out of the runtime."""
