"""The field registry's data (``router.api.common.fields`` reads it): per API, each known
request field → ``(status, off, sim, note)``.

``status``: ``HONOURED`` (on mlx, vllm and sim; ``sim=NO_EFFECT`` where the emulator's
synthetic text cannot show it), ``REFUSED`` (a 400 naming it unless its value is one of
``off``) or ``HARMLESS`` (accepted and ignored: it cannot change the output).
The chat and completions lists cover every field of vLLM's own request models
(``tests/router/fixtures/vllm_request_fields.json``).
"""

from __future__ import annotations

from typing import Any

HONOURED, REFUSED, HARMLESS = "honoured", "400", "ignored (harmless)"
NO_EFFECT = "no effect"  # the emulator accepts it; its synthetic text cannot show it
Spec = tuple[Any, ...]


def ok(sim: str | None = None, note: str = "") -> Spec:
    return (HONOURED, (), sim, note)


def emulated(note: str = "") -> Spec:
    """Honoured on mlx and vllm; the emulator takes it with no effect on its text."""
    return (HONOURED, (), NO_EFFECT, note)


def harmless(note: str = "") -> Spec:
    return (HARMLESS, (), None, note)


def refused(*off: Any, note: str = "") -> Spec:
    return (REFUSED, off, None, note)


NO_ALT = "needs an engine feature kvroute does not drive"
SAMPLING = {  # every sampling control, on chat and completions (OpenAI's and vLLM's)
    "temperature": emulated("Unset: the model's generation_config.json, else 1.0."),
    "top_p": emulated("Unset: the model's generation_config.json, else 1.0."),
    "top_k": emulated("vLLM's: 0 or -1 off."),
    "min_p": emulated(),
    "presence_penalty": emulated("[-2, 2], over the output."),
    "frequency_penalty": emulated("[-2, 2], over the output."),
    "repetition_penalty": emulated("> 0, over the prompt and the output."),
    "logit_bias": emulated("Token id (in the vocabulary) -> bias, clamped to [-100, 100]."),
    "bad_words": emulated(),
    "seed": ok(),
    "stop": ok(),
    "stop_token_ids": ok(),
    "min_tokens": ok(note="EOS, stop token ids and stop strings cannot end the output sooner."),
    "ignore_eos": ok(),
    "max_tokens": ok(),
}
VLLM_EXTRAS = {  # vLLM's fields beyond OpenAI's that kvroute cannot honour (yet)
    "logprob_token_ids": refused([], note=NO_ALT),
    "include_stop_str_in_output": refused(False, note=NO_ALT),
    "length_penalty": refused(1.0, note="beam search only, which kvroute does not run"),
    "use_beam_search": refused(False, note="beam search is not supported"),
    "watermarking": refused(False, note=NO_ALT),
    "skip_special_tokens": refused(True, note="special tokens stay as kvroute's parsers need"),
    "spaces_between_special_tokens": refused(True, note=NO_ALT),
    "truncate_prompt_tokens": refused(note="prompts are never truncated"),
    "truncation_side": refused(note="prompts are never truncated"),
    "allowed_token_ids": refused([], note=NO_ALT),
    "thinking_token_budget": refused(note=NO_ALT),
    "mm_payload": refused(note="text-only models"),
    "return_mm_kwargs": refused(False, note="text-only models"),
    "return_tokens_as_token_ids": refused(False, note=NO_ALT),
    "return_token_ids": refused(False, note=NO_ALT),
    "return_token_offsets": refused(False, note=NO_ALT),
    "return_prompt_text": refused(False, note=NO_ALT),
    "routed_experts_prompt_start": refused(0, note=NO_ALT),
    "cache_salt": refused(note="tenant isolation is the server's (index.tenant_isolation)"),
    "kv_transfer_params": refused({}, note=NO_ALT),
    "ec_transfer_params": refused({}, note=NO_ALT),
    "vllm_xargs": refused({}, note=NO_ALT),
    "repetition_detection": refused(note=NO_ALT),
    "prompt_logprobs": ok(note="every prompt token after the first; skips the prefix cache"),
    "structured_outputs": ok(note="json, regex, choice, grammar, json_object: enforced."),
    "response_format": ok(note="json_object, json_schema (strict or not): enforced."),
    "stream_options.continuous_usage_stats": ok(note="with include_usage: usage on every chunk"),
    "priority": harmless("scheduling order only"),
    "request_id": harmless("kvroute names the request itself"),
    "session_id": harmless(),
    "stream_interval": harmless("chunking only (stream_interval_ms is the server's)"),
    "user": harmless(),
    "model": ok(),
    "stream": ok(),
    "stream_options": ok(note="include_usage honoured."),
    "prompt_cache_key": ok(note="a session key for routing"),
    "echo": ok(note="the prompt first; with logprobs, its logprobs too"),
    "n": ok(note="1..128 choices (prompts × n); copies on the first's replica, seeded seed+i"),
}
GUIDED = {**{name: ok(note="vLLM's older structured-output names")
             for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")},
          "guided_decoding_backend": harmless("kvroute picks the engine's backend"),
          "guided_whitespace_pattern": refused(note=NO_ALT)}
CHAT_ONLY = {
    "messages": ok(),
    "max_completion_tokens": ok(),
    "tools": ok(),
    "parallel_tool_calls": ok(note="false keeps the first call"),
    "reasoning_effort": ok(note="passed to thinking templates"),
    "tool_choice": ok(note="required and a named tool: the call decoded under the tools' grammar"),
    "logprobs": ok(),
    "top_logprobs": ok(note="0..20"),
    "echo": refused(False, note="vLLM's chat echo (the last message's text first) is not served"),
    "include_reasoning": refused(True, note=NO_ALT),
    "add_generation_prompt": refused(True, note="the template always adds it"),
    "continue_final_message": refused(False, note=NO_ALT),
    "add_special_tokens": refused(False, note="the chat template places special tokens"),
    "documents": refused(note=NO_ALT),
    "chat_template": refused(note="the model's own template is used"),
    "chat_template_kwargs": refused({}, note="use reasoning_effort"),
    "media_io_kwargs": refused({}, note="text-only models"),
    "mm_processor_kwargs": refused({}, note="text-only models"),
    "modalities": refused(["text"], note="text-only models"),
    "audio": refused(note="text-only models"),
    "prediction": refused(note=NO_ALT),
    "web_search_options": refused(note="kvroute runs no hosted tools"),
    "functions": refused(note="deprecated: use tools"),
    "function_call": refused(note="deprecated: use tool_choice"),
    "store": harmless(),
    "metadata": harmless(),
    "service_tier": harmless(),
    "safety_identifier": harmless(),
    "prompt_cache_retention": harmless(),
    "verbosity": harmless("a hint for OpenAI's own models (vLLM ignores it too)"),
}
COMPLETIONS_ONLY = {
    "prompt": ok(note="a string or token ids, or a batch of either"),
    "logprobs": ok(note="0..20 (vLLM's bound; OpenAI's is 5)"),
    "best_of": ok(note="only equal to n (vLLM's V1 engine ranks no extra samples): else a 400"),
    "suffix": refused(note=NO_ALT),
    "prompt_embeds": refused(note=NO_ALT),
    "add_special_tokens": refused(True, note=NO_ALT),
    "max_tokens": ok(note="unset: 16, as OpenAI and vLLM"),
    "max_completion_tokens": ok(note="as max_tokens"),
}
MESSAGES = {
    "model": ok(), "messages": ok(), "max_tokens": ok(), "system": ok(), "stream": ok(),
    "stop_sequences": ok(), "tools": ok(), "thinking": ok(note="passed to thinking templates"),
    "temperature": emulated("Unset: the model's generation_config.json, else 1.0."),
    "top_p": emulated(), "top_k": emulated(),
    "metadata": ok(note="user_id: a session key for routing"),
    "output_config": ok(note="effort passed to thinking templates"),
    "output_config.format": ok(note="json_schema: enforced while decoding"),
    "output_format": refused(note="the older name of output_config.format"),
    "tool_choice": ok(note="any and a named tool: the call decoded under the tools' grammar"),
    "safeguards": ok(note="Claude Code's auto mode: answered as the safeguards.mode setting says"),
    "context_management": harmless("accepted, not applied: edits would move the cached prefix"),
    "service_tier": harmless(),
    "inference_geo": harmless(),
    "container": refused(note="kvroute runs no hosted tools"),
    "mcp_servers": refused([], note="kvroute runs no hosted tools"),
}
RESPONSES = {
    "model": ok(), "input": ok(), "instructions": ok(), "tools": ok(), "stream": ok(),
    "parallel_tool_calls": ok(), "max_output_tokens": ok(), "previous_response_id": ok(),
    "store": ok(note="kvroute's response store"),
    "prompt_cache_key": ok(note="a session key for routing"),
    "reasoning": ok(note="effort passed to thinking templates; summary ignored"),
    "text": ok(note="verbosity ignored (a hint for OpenAI's own models)"),
    **{k: SAMPLING[k] for k in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                "frequency_penalty", "repetition_penalty", "logit_bias",
                                "seed", "stop", "stop_token_ids", "ignore_eos")},
    "text.format": ok(note="json_object and json_schema: enforced while decoding"),
    "tool_choice": ok(note="required and a named tool: the call decoded under the tools' grammar"),
    "structured_outputs": refused(note="text.format is the Responses API's structured output"),
    "top_logprobs": ok(note="0..20, with include message.output_text.logprobs"),
    "include": ok(note="message.output_text.logprobs honoured; other values ignored"),
    "background": refused(False, note=NO_ALT),
    "max_tool_calls": refused(note=NO_ALT),
    "prompt": refused(note="stored prompts are OpenAI's"),
    "conversation": refused(note="use previous_response_id"),
    "truncation": refused("disabled", note="prompts are never truncated"),
    "previous_input_messages": refused([], note=NO_ALT),
    "enable_response_messages": refused(False, note=NO_ALT),
    **{k: VLLM_EXTRAS[k] for k in ("include_stop_str_in_output", "skip_special_tokens",
                                   "mm_payload", "return_mm_kwargs", "cache_salt", "watermarking",
                                   "kv_transfer_params", "ec_transfer_params", "vllm_xargs",
                                   "priority", "request_id", "session_id")},
    "include_reasoning": CHAT_ONLY["include_reasoning"],
    "chat_template_kwargs": CHAT_ONLY["chat_template_kwargs"],
    "media_io_kwargs": CHAT_ONLY["media_io_kwargs"],
    "mm_processor_kwargs": CHAT_ONLY["mm_processor_kwargs"],
    "metadata": harmless(), "user": harmless(), "service_tier": harmless(),
    "safety_identifier": harmless(), "prompt_cache_retention": harmless(),
    "stream_options": harmless("include_obfuscation only"),
    "client_metadata": harmless(),
}
API_FIELDS: dict[str, dict[str, Spec]] = {
    "chat": {**SAMPLING, **VLLM_EXTRAS, **GUIDED, **CHAT_ONLY},
    "completions": {**SAMPLING, **VLLM_EXTRAS, **GUIDED, **COMPLETIONS_ONLY},
    "messages": MESSAGES,
    "responses": RESPONSES,
}
