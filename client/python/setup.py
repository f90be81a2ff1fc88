"""Builds the flashsampler package; the protobuf/gRPC stubs are generated here.

The .proto files live in the repository's proto/ folder (shared with the C++
server and client), so the Python stubs are generated from the same source at
build time instead of being committed.
"""
import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
SERVICE_PROTO = PROTO_ROOT / "flashsampler" / "v1" / "sampler.proto"


def generate_stubs(out_dir: pathlib.Path) -> None:
    from grpc_tools import protoc  # build requirement (pyproject.toml)
    import grpc_tools

    if not SERVICE_PROTO.exists():
        raise RuntimeError(f"{SERVICE_PROTO} not found: build from a checkout of the repository")
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(SERVICE_PROTO),
    ])
    if rc != 0:
        raise RuntimeError(f"protoc failed on {SERVICE_PROTO} (exit {rc})")


class BuildPyWithStubs(build_py):
    def run(self):
        # Generated next to the sources too, so an editable install imports them.
        generate_stubs(HERE)
        super().run()


setup(cmdclass={"build_py": BuildPyWithStubs})
