"""llama.cpp as a peer: its Python binding's generation on the default model's file (llamacpp) and its own
llama-bench tool on the same file (llama_bench), both labelled as another engine's figures."""
