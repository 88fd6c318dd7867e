"""Packaging shim: everything else is declared in pyproject.toml.

The seed job files live once, in the repository's ``examples/`` (where the README's
``trainfit plan examples/seed….yaml`` commands and the benchmarks read them), and the installed
package must carry them too (``trainfit quickstart`` plans ``seed000_t4_gemma_lora.yaml``;
``trainfit plan seed….yaml`` finds a bare seed name). pyproject.toml cannot add a package that lives
outside ``src/`` next to the automatic discovery, so the mapping is made here: ``trainfit.examples``
is built from ``examples/`` (its ``*.yaml``, per ``[tool.setuptools.package-data]``) and lands in
the wheel as ``trainfit/examples/``, where ``trainfit.cli.main.examples_dir()`` finds it through
``importlib.resources``. No second copy of the YAMLs is kept in the repository.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages("src", include=["trainfit", "trainfit.*"]), "trainfit.examples"],
    package_dir={"": "src", "trainfit.examples": "examples"},
)
