"""``kvroute bench router``: the router's CPU and added latency (``bench``), the move,
agent, stall and specials scenarios, and the child stack of another tree (``tree_stack``)."""
