"""The playground: chat with a finished job's model and with its base model, by default on the CPU,
from GGUF files through llama.cpp (lanner.inference), so chat never takes GPU memory from the
training queue; on a GPU only as a queued job of kind `chat` (gpu_session.py).

sources.py finds the GGUF of each side, lanner.inference.cache keeps loaded models under a memory
bound with a pool of contexts each, lanner.inference.generation streams one answer, gpu_session.py
queues GPU sessions; the WebSocket is lanner.backend.routers.playground."""
