"""The torch-CUDA backend: ``backend`` builds an engine (the export's weights and a table mapping them to the model's
parameters) and opens it; ``session`` runs it (a KV cache preallocated on the GPU, the decode step captured as a
CUDA graph, sampling on the GPU); ``decoder`` is the decoder's layers (edgellm.models.decoder) around that cache.
Importing this package registers the backend and imports no torch.
"""

from edgellm.backends.torch_cuda.backend import (
    ENGINE_DATA,
    WEIGHT_TABLE,
    TorchCudaBackend,
    check_precision,
    check_table,
    cuda_unavailable_reason,
    gpu_info,
    read_table,
    table_precision,
    weight_table,
)

__all__ = ["ENGINE_DATA", "WEIGHT_TABLE", "TorchCudaBackend", "check_precision", "check_table",
           "cuda_unavailable_reason", "gpu_info", "read_table", "table_precision", "weight_table"]
