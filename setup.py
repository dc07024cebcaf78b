"""What pyproject.toml cannot say: the committed default models and the example configuration
ship inside the gateway package (``tesla_gateway/default_models``, ``tesla_gateway/examples``),
read from
``models/`` and ``deploy/`` where they live in the checkout. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    # The gateway alone: training/ and devkit/ stay in the checkout (pyproject.toml says why).
    packages=[
        *find_packages(include=["tesla_gateway", "tesla_gateway.*"]),
        "tesla_gateway.default_models",
        "tesla_gateway.examples",
    ],
    package_dir={"tesla_gateway.default_models": "models", "tesla_gateway.examples": "deploy"},
)
