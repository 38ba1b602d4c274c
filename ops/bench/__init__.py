"""``kvroute bench``: every benchmark, one subcommand each (``cli`` names them; ``python -m
ops.bench ARGS`` is the same as ``kvroute bench ARGS``).

``harness/`` is what the benches share (the load generator, workloads, bench JSON, the stack
launcher, the config builder, the timing loop); ``load`` is the load mode (``bench --url``);
``compare/``, ``router/``, ``autoscale/``, ``leases/`` and ``micro/`` hold the benches of
one subject each; ``engines``, ``index``, ``kv_disk`` and ``cpu_profile`` one bench each.
"""
