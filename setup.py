"""Build of opwarden's optional compiled kernels (opwarden/native); the rest is pyproject.toml.

The extension is optional: where it does not compile (no C compiler, another platform),
`pip install .` still succeeds and opwarden runs its NumPy kernels (opwarden.native.status()
says why). OpenMP is used where the compiler accepts -fopenmp; no -march flag is passed, so
a wheel built here runs on any CPU of the architecture.
"""

from __future__ import annotations

import os
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _accepts(compiler, flags: list[str]) -> bool:
    """Whether the C compiler compiles and links a tiny OpenMP program with `flags`."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as fh:
            fh.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n")
        try:
            objs = compiler.compile([src], output_dir=tmp, extra_postargs=flags)
            compiler.link_executable(objs, os.path.join(tmp, "probe"), extra_postargs=flags)
        except Exception:  # noqa: BLE001 - any failure means: build without OpenMP
            return False
    return True


class OptionalOpenMPBuild(build_ext):
    """build_ext adding -O3, -fno-trapping-math and (where it works) -fopenmp for GCC/Clang."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            omp = ["-fopenmp"] if _accepts(self.compiler, ["-fopenmp"]) else []
            for ext in self.extensions:
                # no-trapping-math: no FP exception is ever trapped or read, and without it
                # GCC keeps the clamps of silu/depthwise/conv_epilogue as branches, which AVX2
                # (no mask registers) cannot vectorize: those loops ran scalar on x86-64-v3.
                ext.extra_compile_args += ["-O3", "-std=c99", "-fno-trapping-math", *omp]
                ext.extra_link_args += omp
        super().build_extensions()


NATIVE = Extension(
    "opwarden.native._native",
    sources=[f"opwarden/native/{f}"
             for f in ("module.c", "trees.c", "epilogue.c", "depthwise.c", "silu.c",
                       "qgemm.c", "qgemm_avx2.c", "quantize.c", "conv_epilogue.c", "gelu.c",
                       "layernorm.c", "cast.c", "softmax.c", "grouped.c", "blas_pool.c",
                       "pool.c", "shuffle.c", "sgemm.c")],
    depends=["opwarden/native/native.h"],
    optional=True,  # a failed compile leaves the NumPy kernels, not a failed install
)

setup(ext_modules=[NATIVE], cmdclass={"build_ext": OptionalOpenMPBuild})
