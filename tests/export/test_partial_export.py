"""An export asked for several formats keeps each one that passes its check and reports each one that
does not; it fails, leaving nothing, only when nothing it was asked for passes. The checks are made to
fail by tightening their bounds to zero: no 16-bit or quantised file is that exact."""
from __future__ import annotations

import pytest
from export_helpers import BASE_MODEL_NAME


def test_a_merged_model_that_fails_its_check_leaves_out_its_ggufs_and_keeps_the_adapter(
        smollm2_dir, trained_adapter, tmp_path, monkeypatch):
    from lanner.worker.export import ExportRequest, run_export, verify

    monkeypatch.setattr(verify, "MERGED_NOISE_FACTOR", 0.0)
    monkeypatch.setattr(verify, "MERGED_ABS_SLACK", 0.0)
    out = tmp_path / "export"
    manifest = run_export(ExportRequest(base_model_dir=smollm2_dir, adapter_dir=trained_adapter, out_dir=out,
                                        base_model_name=BASE_MODEL_NAME, gguf_types=("f16", "q8_0")))
    assert [(a["kind"], a["status"]) for a in manifest["artifacts"]] == [("adapter", "unchecked")]
    assert manifest["formats"]["merged"]["status"] == "failed"
    assert "does not match the trained adapter" in manifest["formats"]["merged"]["reason"]
    assert "max |logit diff|" in manifest["failed"]["merged"] and "above its bound" in manifest["failed"]["merged"]
    assert {manifest["formats"][f"gguf-{t}"]["status"] for t in ("f16", "q8_0")} == {"not made"}
    assert sorted(p.name for p in out.iterdir()) == ["adapter", "export.json"]
    assert manifest["verification"]["merged"]["passed"] is False


def test_an_export_of_which_nothing_passes_fails_and_leaves_nothing(smollm2_dir, trained_adapter, tmp_path,
                                                                    monkeypatch):
    from lanner.worker.export import ExportError, ExportRequest, run_export, verify

    monkeypatch.setattr(verify, "MERGED_NOISE_FACTOR", 0.0)
    monkeypatch.setattr(verify, "MERGED_ABS_SLACK", 0.0)
    with pytest.raises(ExportError, match="Nothing of this export passed its check: The merged model does not match"):
        run_export(ExportRequest(base_model_dir=smollm2_dir, adapter_dir=trained_adapter, out_dir=tmp_path / "export",
                                 adapter=False, gguf_types=()))
    assert list(tmp_path.iterdir()) == []
