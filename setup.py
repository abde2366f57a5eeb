"""Build hook for the one optional C extension (gradtool/core/_kernels.c); everything else is in
pyproject.toml. ``optional=True``: without a C compiler the install still succeeds and gradtool uses its
NumPy code paths (the same results, slower; ``gradtool --version`` says which)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gradtool.core._kernels",
            ["gradtool/core/_kernels.c"],
            depends=["gradtool/core/_kernels_loops.h", "gradtool/core/_kernels_summary.h"],
            extra_compile_args=["-O3", "-ffp-contract=off"],  # the same bits from every SIMD build
            optional=True,
        )
    ]
)
