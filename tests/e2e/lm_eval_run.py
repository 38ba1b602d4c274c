"""lm-eval 0.4's ``local-completions`` with its defaults (tokenized requests, batch size 1:
``prompt: [[ids]]``, ``echo`` + ``logprobs`` for loglikelihoods) against a kvroute stack, on
the two local tasks in ``lm_eval_tasks/``: a multiple-choice (loglikelihood) one and a
generation one. Offline, its telemetry off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

TASKS = Path(__file__).parent / "lm_eval_tasks"


def evaluate(url: str, model: str, tokenizer: Path, monkeypatch: pytest.MonkeyPatch,
             tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    """(the lm-eval model, ``simple_evaluate``'s output with its samples)."""
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY",
                "DO_NOT_TRACK"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(TASKS)  # the tasks' data_files are relative to it
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    lm = LocalCompletionsAPI(base_url=f"{url}/v1/completions", model=model,
                             tokenizer=str(tokenizer))
    out = simple_evaluate(model=lm, tasks=["kvroute_mc", "kvroute_gen"], log_samples=True,
                          task_manager=TaskManager(include_path=str(TASKS)))
    assert out is not None
    assert 0 <= out["results"]["kvroute_mc"]["acc,none"] <= 1
    assert 0 <= out["results"]["kvroute_gen"]["exact_match,none"] <= 1
    gens = out["samples"]["kvroute_gen"]
    assert len(gens) == 2 and all(isinstance(s["resps"][0][0], str) for s in gens)
    return lm, out
