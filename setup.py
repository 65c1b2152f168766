"""The top-level folders install as one namespace: backend/ -> lanner.backend, and so on."""
from setuptools import find_packages, setup

TOP = ("core", "backend", "worker", "inference", "kernels", "cli")

setup(
    package_dir={f"lanner.{top}": top for top in TOP},
    packages=[f"lanner.{pkg}" for pkg in find_packages(include=[f"{top}*" for top in TOP])],
    package_data={"lanner.core": ["migrations/script.py.mako"]},
)
