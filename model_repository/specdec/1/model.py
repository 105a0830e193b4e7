"""Triton entry point: the model lives in the trispec package (trispec.serving.triton_model)."""

from trispec.serving.triton_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
