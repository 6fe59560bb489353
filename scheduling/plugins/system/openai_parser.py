"""openai-parser (llm-d): the request parser named by an EndpointPickerConfig's `parser.pluginRef`.

    api kind = the path (then x-original-path, x-forwarded-path): chat/completions, completions, embeddings,
               responses, conversations (OpenAI) or messages (Anthropic)
    model    = body["model"];  prompt = what the prefix plugins hash (see epp/request/parsing.py)

It takes no parameters: Pointsman's own parser is the only one, and this plugin names it.
"""

from __future__ import annotations

from scheduling.framework import System, register


@register("openai-parser")
class OpenAIParser(System[None]):
    Params = None
