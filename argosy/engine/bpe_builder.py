"""Trains the small byte-level BPE tokenizer that random-weight test checkpoints ship with (see random_model.py).

A test helper, shipped for `argosy make-test-model`; the engine never imports it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

# Training text for build_test_tokenizer: varied English prose, code, numbers and a little of other scripts.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman and his daughter. Every "
    "morning they walked down to the harbour, mended their nets and talked about the weather and the tides.",
    "Language models predict the next token from the tokens before it. A server batches many requests together, "
    "keeps their keys and values in a paged cache, and streams the generated text back to each user.",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; i++) { printf(\"%d\\n\", i * i); }  // squares of the first ten numbers",
    "In 1969, three astronauts flew to the Moon; the trip took about 76 hours and covered 384,400 kilometres.",
    "Q: What is the capital of France?\nA: Paris is the capital of France.\nQ: And of Japan?\nA: Tokyo.",
    "User: Can you help me write a short poem about autumn?\nAssistant: Of course! Golden leaves drift down, "
    "the evening air is cool, and the quiet fields wait for the first frost of the year.",
    "Bonjour, je m'appelle Marie. Wie geht es dir heute? ¿Dónde está la biblioteca? Ciao, come stai?",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다. Москва — столица России. 🙂🚀✨",
    "Prices rose 3.5% in March, to $1,299.99 per unit; the report (page 42) lists 17 reasons why.",
    "Rivers carry water from the mountains to the sea. Forests cover nearly a third of the land, and they are "
    "home to most of the animals and plants that live on it. Rain falls, the rivers rise, and the cycle goes on.",
    "Please remember to bring your passport, your tickets and a warm coat: the nights are cold in the north.",
]
_CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_test_tokenizer(folder: str | Path, vocab_size: int = 512, corpus: list[str] | None = None) -> Path:
    """Train a byte-level BPE (any Unicode text round-trips) and write tokenizer.json and tokenizer_config.json
    (BOS <s> added by the post-processor, EOS </s>, a ChatML chat template) into `folder`. The vocabulary
    holds at most `vocab_size` tokens: fewer when the corpus runs out of merges. Needs no transformers."""
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]  # ids 0..4
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus or _CORPUS, trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos_id)])
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False,
        "chat_template": _CHATML_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return folder
