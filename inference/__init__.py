"""The llama.cpp engine: GGUF models loaded under a memory bound and streamed answers (playground, export checks)."""
