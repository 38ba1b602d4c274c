"""``kvroute bench``: load generation, trace replay and router comparison (issue 9).

``workloads`` (trace and agent generators), ``client`` (the async load generator),
``report`` (bench JSON, tables, plots), ``compare`` (kvroute vs other routers over
the same replicas), ``cli`` (``add_parser`` for ``deploy.cli.main``). Also runnable as
``python -m ops.bench ...`` (the same arguments as ``kvroute bench ...``).
"""
