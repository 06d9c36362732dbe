"""Text: a deterministic synthetic corpus with a byte tokenizer, and a small GPT on Paddle's hybrid building blocks.

* :mod:`fleetlite.text.corpus`  ``synthetic_corpus``, ``encode`` / ``decode`` (bytes), ``batch_of_windows``
* :mod:`fleetlite.text.gpt`     ``GPTConfig``, ``GPT`` (tensor parallel when mp > 1), ``gpt_pipeline_descs``

Nothing is imported here (the modules import torch and fleet's meta_parallel).
"""
