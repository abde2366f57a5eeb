"""Build hook for the optional C extensions (gradtool/core/_kernels.c, the numeric kernels;
gradtool/io/_logscan.c, the log readers; gradtool/io/_inflate_many.c, an npz's small compressed members
inflated many to a call, linked to zlib); everything else is in pyproject.toml. ``optional=True``:
without a C compiler the install still succeeds and gradtool uses its NumPy and Python code paths (the
same results, slower; ``gradtool --version`` says which)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gradtool.core._kernels",
            ["gradtool/core/_kernels.c"],
            depends=["gradtool/core/_kernels_loops.h", "gradtool/core/_kernels_summary.h", "gradtool/_crc32.h"],
            extra_compile_args=["-O3", "-ffp-contract=off"],  # the same bits from every SIMD build
            optional=True,
        ),
        Extension(
            "gradtool.io._logscan",
            ["gradtool/io/_logscan.c"],
            depends=["gradtool/io/_logscan_pow10.h", "gradtool/_crc32.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(  # needs zlib's header: where it is missing, only this one is not built
            "gradtool.io._inflate_many",
            ["gradtool/io/_inflate_many.c"],
            libraries=["z"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ]
)
