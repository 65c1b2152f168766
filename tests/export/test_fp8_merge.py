"""An adapter trained over an FP8 base (lora_fp8) is merged into the original 16-bit weights (no
re-quantisation), and the export checks the merged model against the FP8-trained model: the FP8 base
with the adapter, within docs/fp8.md's bound (twice the base's own 16-bit vs FP8 gap, plus the merge's)."""
from __future__ import annotations

from export_helpers import make_adapter, tiny_model


def test_an_fp8_base_adapter_is_checked_against_the_fp8_trained_model(smollm2_dir, tmp_path):
    from lanner.worker.export import ExportRequest, run_export
    from lanner.worker.export.verify import verify_against_fp8_trained, verify_merged

    base = tiny_model("llama", smollm2_dir, tmp_path / "base")
    adapter = make_adapter(base, tmp_path / "adapter", lora_b_std=0.3)
    manifest = run_export(ExportRequest(base_model_dir=base, adapter_dir=adapter, out_dir=tmp_path / "export",
                                        adapter=False, gguf_types=(), fp8_base=True))
    merged, fp8 = manifest["verification"]["merged"], manifest["verification"]["fp8_trained"]
    assert "merged_into" not in manifest["artifacts"][0]  # the original weights, as a lora adapter's
    assert merged["passed"] and fp8["passed"], fp8
    assert 0 < fp8["base_fp8_gap_max_abs_logit_diff"] and fp8["max_abs_logit_diff"] <= fp8["bound_max_abs_logit_diff"]
    assert merged["adapter_effect_max_abs_logit_diff"] > fp8["bound_max_abs_logit_diff"]  # the bound can fail

    # Another adapter's merge is not this FP8-trained model.
    other = make_adapter(base, tmp_path / "other", lora_b_std=0.3, seed=1)
    from lanner.worker.export import export_merged

    export_merged(base, other, tmp_path / "merged-other")
    check, reference = verify_merged(base, other, tmp_path / "merged-other", return_reference=True)
    assert not verify_against_fp8_trained(base, adapter, reference, check)["passed"]
