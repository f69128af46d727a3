"""The dtypes the library takes, by the names it gives them."""
import torch

DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
          torch.float16: "float16"}


def vector_dtype_name(vector_dtype):
    """A vector dtype as the library names it: None is "auto" (the model's dtype, float32 for a
    16-bit model)."""
    if vector_dtype is None:
        return "auto"
    if vector_dtype not in DTYPES:
        raise ValueError(f"vector_dtype {vector_dtype}: expected None, torch.float64, "
                         "torch.float32, torch.bfloat16 or torch.float16")
    return DTYPES[vector_dtype]
