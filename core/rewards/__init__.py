"""GRPO's reward functions: the built-ins (builtin.py, pure) and the sandbox that runs a job's
functions, user-written Python included, in a limited subprocess (sandbox.py, sandbox_child.py).
Shared by the API (the test route) and the worker (training); docs/rewards.md."""
