"""The ``kvroute up`` demo's agent model: the sim engine emulator answering from a script.

The demo's real engine (mlx on the tiny random-weight model) never emits EOS: an agent
that asks for 32000 tokens (Claude Code, Qwen Code) would wait minutes for each turn. So
the demo serves, beside it, ``demo-agent``: the sim emulator on the same tokenizer, with
a script (``workers/engines/sim/script.py``) that ends every turn within a second, says
plainly what it is, and calls the client's own shell tool when the user types
``demo-tool``. Every client's vendor model names (``claude-*``, ``gpt-*``, ``*``) are
aliases of it; ``tiny-llama`` stays the real engine, for curl and the SDKs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

AGENT_MODEL = "demo-agent"
TRIGGER = "demo-tool"
COMMAND = "echo hello from the kvroute demo && ls"
HELLO = (f"Hello. I am {AGENT_MODEL}, kvroute's demo model: a scripted engine emulator, not "
         "a language model, so I cannot read what you wrote. kvroute routed this turn to a "
         "replica that holds your conversation's prefix in its cache. Type "
         f"'{TRIGGER}' and I will call your shell tool once. For real answers, serve a real "
         "checkpoint: kvroute up --model PATH_OR_ID.")
AFTER_TOOL = (f"Your tool ran (its output is above; I cannot read it: I am {AGENT_MODEL}, a "
              "scripted emulator). That was a whole tool round trip through kvroute.")
# (the client's shell tool as its definition names it, the call's arguments)
SHELL_TOOLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("Bash", {"command": COMMAND, "description": "Run the kvroute demo's command"}),  # Claude
    ("run_shell_command", {"command": COMMAND, "description": "kvroute demo"}),  # Qwen Code
    ("run_commands", {"commands": [COMMAND]}),  # Cline
    ("bash", {"command": COMMAND, "description": "Run the kvroute demo's command"}),  # OpenCode
    ("exec_command", {"cmd": COMMAND}),  # Codex
    ("shell", {"command": ["bash", "-lc", COMMAND]}),  # older Codex
)


def script() -> dict[str, Any]:
    """The demo's sim script: a tool call when asked (in the tiny model's Hermes format,
    for the first shell tool the client offers), a plain honest text otherwise."""
    rules: list[dict[str, Any]] = [{"match": "<tool_response>", "reply": AFTER_TOOL}]
    for name, args in SHELL_TOOLS:
        call = json.dumps({"name": name, "arguments": args})
        rules.append({"match": TRIGGER, "requires": f'"name": "{name}"',
                      "reply": f"<tool_call>\n{call}\n</tool_call>"})
    rules.append({"match": "", "reply": HELLO})
    return {"segment_marker": "<|im_start|>user", "rules": rules}


def write_script(cache_dir: Path) -> Path:
    """The script file the demo's sim replicas load (rewritten on each start)."""
    path = cache_dir / "demo-agent-script.json"
    cache_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(script(), indent=1))
    return path
