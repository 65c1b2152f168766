"""Export: LoRA adapters (PEFT), merged 16-bit models and GGUF files, each verified against the
trained model. `run_export` makes a whole export job; the functions below it each make one artifact."""
from .adapter import export_adapter
from .dequantize import Quantization
from .files import DiskFull, ExportError, NotEnoughDiskSpace, ensure_free_space, remove_partials
from .gguf_convert import convert_to_gguf
from .gguf_quantize import QUANT_TYPES, quantize_gguf
from .merge import export_merged, export_whole_model
from .modelfile import write_modelfile
from .pipeline import STAGES, ExportRequest, expected_bytes, run_export
from .verify import verify_gguf, verify_merged, verify_whole_model

__all__ = ["DiskFull", "ExportError", "ExportRequest", "NotEnoughDiskSpace", "QUANT_TYPES", "Quantization", "STAGES",
           "convert_to_gguf", "ensure_free_space", "expected_bytes", "export_adapter", "export_merged",
           "export_whole_model", "quantize_gguf", "remove_partials", "run_export", "verify_gguf", "verify_merged",
           "verify_whole_model", "write_modelfile"]
