"""A small Hugging Face tokenizer the tests build themselves (nothing is downloaded): a byte-level BPE trained
on a few sentences, a BOS post-processor, and a ChatML-style chat template in tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CHATML = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if tools %}<|im_start|>tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SENTENCES = [
    "You are a helpful assistant.", "What is the capital of France?", "The capital of France is Paris.",
    "Write a haiku about routers and caches.", "hello world, hello tokens", "système: répondez en français",
] * 20


def build_tokenizer(d: Path, template: object = CHATML, bos: object = "<s>", jinja_file: bool = False) -> Path:
    """A small byte-level BPE trained on a few sentences, with a BOS post-processor and a ChatML template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  special_tokens=["<s>", "</s>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    config: dict = {"bos_token": bos, "eos_token": "</s>"}
    if jinja_file:
        (d / "chat_template.jinja").write_text(str(template))
    else:
        config["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d
