"""The four top-level folders install as one namespace: backend/ -> lanner.backend, and so on."""
from setuptools import find_packages, setup

TOP = ("backend", "worker", "kernels", "cli")

setup(
    package_dir={f"lanner.{top}": top for top in TOP},
    packages=[f"lanner.{pkg}" for pkg in find_packages(include=[f"{top}*" for top in TOP])],
    package_data={"lanner.backend": ["migrations/script.py.mako"]},
)
