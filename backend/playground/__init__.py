"""The playground: chat with a finished job's model and with its base model, by default on the CPU,
from GGUF files through llama.cpp (lanner.inference), so chat never takes GPU memory from the
training queue; on a GPU only as a queued job of kind `chat` (gpu_session.py).

sources.py finds the GGUF of each side, answers.py answers one generate request (a thread per side;
lanner.inference.cache keeps the loaded models under a memory bound with a pool of contexts each,
lanner.inference.generation streams one answer), gpu_session.py queues, closes and checks GPU sessions,
gpu_relay.py carries a question to a session's process and its answer back, evaluation.py reads a
job's before/after evaluation; the routes and the WebSocket are lanner.backend.routers.playground."""
