"""``python -m router.auth`` is an alias of ``kvroute keys new`` (ops/commands/) kept for existing
scripts. The command code lives in ops/; the runtime never imports ops/ (pyproject's
import-linter contracts), so the alias loads it by name, only when run."""

import runpy

runpy.run_module("ops.commands.keys", run_name="__main__", alter_sys=True)
