import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
