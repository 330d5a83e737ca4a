"""Every model format in and out, one module per format, each with its reader AND its writer, so a round
trip is read in one file.

    hf.py          transformers checkpoints (config.json + safetensors): load_checkpoint, from_transformers,
                   to_transformers, export_transformers; hf_config.py turns config.json into our configs,
                   hf_config_write.py back; families.py holds one entry per family that both directions walk
    gguf.py        llama.cpp GGUF files -> dequantised transformers checkpoint cache (llama, qwen2, gemma3;
                   cache_root, architecture read from the header before hashing)
    gguf_deci.py   llama.cpp's `deci` GGUF (per-layer head counts): load_deci; export_gguf, which chooses the
                   architecture (deci, qwen2, gemma3) and says why
    gguf_own.py    qwen2 / gemma3 written as their own llama.cpp architectures, and when they can be
    gguf_write.py  what every GGUF writer shares: GQA group layout, tokenizer fields copied, atomic write
    native.py      headcount's own saved format (per-layer layouts): read / write / save
    tensors.py     what every reader shares: checked safetensors reads, weight assignment, no_init
    errors.py      CheckpointError, GGUFError
"""
