"""What every bench shares: the load generator (``client``), the workloads, the bench JSON
and tables (``report``), child processes (``procs``), CPU and latency meters (``lineup``),
the TTFT tail (``tail``), the stack launcher (``stack``), the benchmark stacks' config
(``config``) and the in-process timing loop (``micro``)."""
