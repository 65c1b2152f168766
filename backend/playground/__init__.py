"""The playground: chat with a finished job's model and with its base model, on the CPU, from GGUF
files through llama.cpp (llama-cpp-python), so chat never takes GPU memory from the training queue.

sources.py finds the GGUF of each side, cache.py keeps loaded models under a memory bound,
generation.py streams one answer; the WebSocket is lanner.backend.routers.playground."""
