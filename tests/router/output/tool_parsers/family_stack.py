"""The families' shared end-to-end stack: what each sim model answers, and its config.

One stack (``conftest.stack``, package-scoped: the tool-call and the reasoning tests
share its start-up) holds a sim model per tool-call family, on the tiny model with the
family's public chat template (``family_models``). Each model's script answers:

- ``KVFAMILY``: a tool call in the family's markup after the text "Checking."
  (``REPLIES``; ``test_families``);
- ``KVREASON-TOOL`` / ``KVREASON-ANSWER``: reasoning in the family's markup, then a
  tool call or an answer (``THINKING``; ``test_reasoning``).
"""

from __future__ import annotations

import json
from pathlib import Path

from deploy.config import ModelConfig
from tests.router.output.tool_parsers.family_models import family_model_dir

ASK = "What is the weather in Paris? KVFAMILY"
REPLIES = {  # each family's tool call as its model writes it, after the text "Checking."
    "hermes": 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
              "\n</tool_call>",
    "qwen3-coder": "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                   "</parameter>\n</function>\n</tool_call>",
    "gpt-oss": "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>"
               'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
               "<|call|>",
    "deepseek-v3.1": "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                     '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek-v3.2": 'Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
                     '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                     "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    "glm-4.5": "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
               "<arg_value>Paris</arg_value>\n</tool_call>",
    "kimi-k2": "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
               "<|tool_calls_section_end|>",
    # MiniMax-M2's prompt opens <think>: the reply closes it first.
    "minimax-m2": "The user wants the weather.\n</think>\n\nChecking.\n<minimax:tool_call>\n"
                  '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                  "</invoke>\n</minimax:tool_call>",
    "mistral": 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    "llama3-json": 'Checking.<|python_tag|>{"name": "get_weather", '
                   '"parameters": {"city": "Paris"}}',
}
THOUGHT, ANSWER = "I should check the weather tool.", "Sunny in Paris."
_ARGS = '{"city": "Paris"}'
# model → (its answer after reasoning, its tool call after reasoning), as it writes them.
THINKING = {
    "hermes": (f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}",  # Qwen3's template
               f"<think>\n{THOUGHT}\n</think>\n\n<tool_call>\n"
               f'{{"name": "get_weather", "arguments": {_ARGS}}}\n</tool_call>'),
    "deepseek-v3.1": (f"{THOUGHT}</think>{ANSWER}",  # the prompt opened <think>
                      f"{THOUGHT}</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather"
                      f"<｜tool▁sep｜>{_ARGS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "deepseek-v3.2": (f"{THOUGHT}</think>{ANSWER}",
                      f"{THOUGHT}</think>\n\n<｜DSML｜function_calls>\n"
                      '<｜DSML｜invoke name="get_weather">\n'
                      '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
                      "</｜DSML｜invoke>\n</｜DSML｜function_calls>"),
    "glm-4.5": (f"\n<think>{THOUGHT}</think>\n{ANSWER}",
                f"\n<think>{THOUGHT}</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                "<arg_value>Paris</arg_value>\n</tool_call>"),
    "minimax-m2": (f"{THOUGHT}\n</think>\n\n{ANSWER}",  # the prompt opened <think>
                   f"{THOUGHT}\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
                   '<parameter name="city">Paris</parameter>\n</invoke>\n</minimax:tool_call>'),
    "kimi-k2": (f"<think>{THOUGHT}</think>{ANSWER}",
                f"<think>{THOUGHT}</think><|tool_calls_section_begin|><|tool_call_begin|>"
                f"functions.get_weather:0<|tool_call_argument_begin|>{_ARGS}<|tool_call_end|>"
                "<|tool_calls_section_end|>"),
    "gpt-oss": (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant"
                f"<|channel|>final<|message|>{ANSWER}",
                f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>"
                f"commentary to=functions.get_weather <|constrain|>json<|message|>{_ARGS}"
                "<|call|>"),
}
# Kimi-K2-Instruct's template does not think: its reasoning format is set, not detected.
REASONING_PARSER = {"kimi-k2": "kimi-k2"}


def family_models(tiny: Path, root: Path) -> list[ModelConfig]:
    """One single-replica sim model per family, answering from its script."""
    models = []
    for family, reply in REPLIES.items():
        rules = [{"match": "KVFAMILY", "reply": reply}]
        if family in THINKING:
            answer, call = THINKING[family]
            rules += [{"match": "KVREASON-TOOL", "reply": call},
                      {"match": "KVREASON-ANSWER", "reply": answer}]
        script = root / f"{family}.json"
        script.write_text(json.dumps({"rules": rules}))
        models.append(ModelConfig(
            name=family, engine="sim", model_path=str(family_model_dir(
                tiny, family, root / family)), reasoning_parser=REASONING_PARSER.get(family),
            num_replicas=1, num_cpus=0.05, engine_kwargs={
                "tpot_s": 0.0005, "prefill_tok_s": 1e6, "script_path": str(script)}))
    return models
