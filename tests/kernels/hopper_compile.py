"""Do the kernels the CPU tests ran also compile for a Hopper GPU?

Triton's CPU interpreter runs a kernel's Python and never type-checks it the way the GPU compiler's front end
does (one type per return across constexpr branches, for one): a kernel can pass every CPU test and fail to build
on the GPU. `record()` notes every interpreted launch (the kernel, its arguments' types, its constexprs);
`front_end_errors()` builds each distinct one to Triton IR for sm_90 in a process without the interpreter (no GPU
needed: the front end is target code only) and returns what failed to build, in words."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import torch

_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
           torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
           torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}


def _is_constexpr(parameter: inspect.Parameter) -> bool:
    return "constexpr" in str(parameter.annotation)


def _type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def launch_key(fn, args, kwargs) -> str:
    """One launch as JSON: the kernel's module and name, its signature and constexprs, its compile options."""
    signature_of_fn = inspect.signature(fn)
    parameters = signature_of_fn.parameters
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    bound = signature_of_fn.bind(*args, **{k: v for k, v in kwargs.items() if k in parameters})
    bound.apply_defaults()
    signature, constexprs = {}, {}
    for name, value in bound.arguments.items():
        if _is_constexpr(parameters[name]) or value is None:
            signature[name], constexprs[name] = "constexpr", value
        else:
            signature[name] = _type(value)
    return json.dumps(dict(module=fn.__module__, name=fn.__name__, signature=signature, constexprs=constexprs,
                           options=options), sort_keys=True)


def record(launches: set, monkeypatch) -> None:
    """Patch the interpreter so that every launch adds its key to `launches` (to this set only: a recording
    within another replaces it for its time)."""
    from triton.runtime.interpreter import InterpretedFunction
    run = getattr(InterpretedFunction.run, "__wrapped__", InterpretedFunction.run)

    def recording_run(self, *args, **kwargs):
        launches.add(launch_key(self.fn, args, kwargs))
        return run(self, *args, **kwargs)
    recording_run.__wrapped__ = run
    monkeypatch.setattr(InterpretedFunction, "run", recording_run)


_BUILD = r'''
import importlib, json, sys
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
failures = []
for line in sys.stdin:
    launch = json.loads(line)
    options = backend.parse_options(launch["options"])
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    try:
        fn = getattr(importlib.import_module(launch["module"]), launch["name"])
        ASTSource(fn=fn, signature=launch["signature"], constexprs=launch["constexprs"]).make_ir(
            target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
    except Exception as error:
        failures.append(f"{launch['module']}.{launch['name']} with {launch['constexprs']}: {str(error).strip()}")
print(json.dumps(failures))
'''


def front_end_errors(launches: set) -> list[str]:
    if not launches:  # a selection of tests that launched no kernel
        return []
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _BUILD], input="\n".join(sorted(launches)) + "\n",
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode:
        raise RuntimeError(f"the Hopper build check did not run: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
