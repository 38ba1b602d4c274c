"""``kvroute soak``: a long mixed workload against a running kvroute, watching for leaks.

Load: ``--concurrency`` closed-loop httpx workers (seeded) send OpenAI chat and
completions and Anthropic messages, streamed and not, and count_tokens; half of them
continue shared-prefix conversations (``x-session-id``), the rest are fresh prompts.
A non-200, a transport error, an error event or a malformed reply is an error.

Every ``--interval`` it samples the Ray processes serving ``--url`` (the raylet above
the process listening on its port, everything under it, the cluster's daemons; or
``--pids``): summed RSS, open fds, per-process RSS; Redis ``used_memory`` and keys;
the interval's latency percentiles. Growth per hour is the least-squares slope after
``--fit-from`` of the run (default: the second half, past warm-up); a bound fails
when the slope minus two standard errors is over it, so noise cannot fail a short
run and a leak does. Bounds and their reasons: docs/reliability.md. Exit code 1 on
errors over ``--max-error-rate`` (default 0: any), growth over a bound, or no
request done. Ctrl-C stops early and still reports; ``--out`` writes the JSON.
Also ``python -m deploy.cli soak``.
"""

from .cli import add_parser, cmd_soak

__all__ = ["add_parser", "cmd_soak"]
