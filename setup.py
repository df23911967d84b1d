"""Package discovery for the user's folder layout (metadata lives in pyproject.toml).

`flows/`, `tasks/`, `predictors/` and `bindings/` sit at the repository root but ship as
subpackages of `maserve_prefect`; their nested packages are found here so that both a wheel and an
editable install map every one of them.
"""

from setuptools import find_packages, setup

MAPPED = ("flows", "tasks", "predictors", "bindings")

packages = ["maserve_prefect", *(f"maserve_prefect.{p}" for p in find_packages("maserve_prefect"))]
package_dir = {"maserve_prefect": "maserve_prefect"}
for folder in MAPPED:
    packages.append(f"maserve_prefect.{folder}")
    package_dir[f"maserve_prefect.{folder}"] = folder
    for sub in find_packages(folder):
        packages.append(f"maserve_prefect.{folder}.{sub}")
        package_dir[f"maserve_prefect.{folder}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir)
